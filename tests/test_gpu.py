"""The GPU paths on a real GPU: CUDA fp16 with GradScaler, bf16 autocast, NCCL, fractional
``num_gpus_per_worker``, FSDP with bf16 on NCCL, Ray Data batches on the device, a
LightningModule on CUDA, a GPU crew reused from the warm pool and a GPU spare taking a dead
rank's device. Skipped where there is no GPU (CI has none); ``tools/gpu_check.sh`` runs them
on a lent GPU machine. One GPU is enough: NCCL refuses two ranks on one device, so the
two-rank tests share it through gloo (which reduces CUDA tensors too)."""
import os
import signal
import time

import pytest
import torch

from operators_for_tests import LinearOperator, PrecisionGANOperator
from raysgd import FSDP, TorchTrainer, TrainingOperator, release_idle_workers
from raysgd.utils import BATCH_SIZE

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.timeout(300)]


@pytest.fixture(autouse=True)
def no_idle_gpu_crew():
    """An idle GPU crew keeps its GPU reserved; the next test needs it."""
    yield
    release_idle_workers()


def gpu_view():
    """What a worker process sees of its GPU (run inside the worker)."""
    import ray
    return {"pid": os.getpid(), "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpus": [str(i) for i in ray.get_gpu_ids()],
            "current": torch.cuda.current_device() if torch.cuda.is_initialized() else None}


def param_devices(trainer):
    return trainer.apply_all_operators(
        lambda op: sorted({str(p.device) for p in op.model.parameters()}))


def test_fp16_one_gpu_worker_scales_and_learns(ray_session):
    trainer = TorchTrainer(training_operator_cls=LinearOperator, num_workers=1, use_gpu=True,
                           use_fp16=True, backend="nccl", config={BATCH_SIZE: 50})
    try:
        kind = trainer.apply_all_operators(
            lambda op: (type(op._context.precision).__name__, op.device.type))
        assert kind == [("ScaledFp16Precision", "cuda")]
        losses = [trainer.train()["train_loss"] for _ in range(6)]
        assert losses[-1] < 0.5 * losses[0]

        def overflow(op):
            prec = op._context.precision
            before = prec.state_dict()["scaler"]["scale"]
            op.optimizer.zero_grad()
            x = torch.ones(4, 1, device=op.device)
            with op.autocast():
                loss = op.criterion(op.model(x), x) * float("inf")
            op.backward(loss)
            skipped = not op.step(op.optimizer)
            return skipped, before, prec.state_dict()["scaler"]["scale"]

        skipped, before, after = trainer.apply_all_operators(overflow)[0]
        assert skipped and after == before * 0.5
    finally:
        trainer.shutdown()


def test_a_commit_copies_gpu_tensors_to_pinned_host_memory_once_waited_for():
    from raysgd.worker.host_copy import host_copies

    live = torch.arange(4096.0, device="cuda") * 3
    copied = host_copies({"w": [live]})["w"][0]
    assert copied.device.type == "cpu" and copied.is_pinned()
    assert torch.equal(copied, torch.arange(4096.0) * 3)


def test_meters_summing_a_gpu_loss_copy_into_a_commit_as_numbers():
    import copy

    from raysgd.worker.metrics import AverageMeterCollection

    meters = AverageMeterCollection()
    for value in (1.0, 3.0):
        meters.update({"train_loss": torch.tensor(value, device="cuda")}, n=2)
    copied = copy.deepcopy(meters)  # what a commit holds; a driver may have no GPU
    held = [value for meter in copied._meters.values() for value in vars(meter).values()]
    assert not any(isinstance(value, torch.Tensor) for value in held)
    assert copied.summary()["train_loss"] == meters.summary()["train_loss"] == 2.0


def test_bf16_autocast_on_cuda_without_a_scaler(ray_session):
    trainer = TorchTrainer(LinearOperator, num_workers=1, use_gpu=True, use_fp16="bf16",
                           config={BATCH_SIZE: 50})
    try:
        def inside(op):
            with op.autocast():
                out = op.model(torch.ones(4, 1, device=op.device))
            return type(op._context.precision).__name__, str(out.dtype)

        name, dtype = trainer.apply_all_operators(inside)[0]
        assert name == "AutocastPrecision" and dtype == "torch.bfloat16"
        assert "scaler" not in (trainer.state_dict().get("precision") or {})
        losses = [trainer.train()["train_loss"] for _ in range(6)]
        assert losses[-1] < 0.5 * losses[0]
        assert param_devices(trainer) == [["cuda:0"]]
    finally:
        trainer.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_fp16_gan_on_two_gpus_with_nccl(ray_session):
    trainer = TorchTrainer(training_operator_cls=PrecisionGANOperator, num_workers=2,
                           use_gpu=True, use_fp16=True, backend="nccl", config={BATCH_SIZE: 64})
    try:
        first = trainer.train()
        for _ in range(3):
            last = trainer.train()
        assert last["mean_distance"] < first["mean_distance"]
    finally:
        trainer.shutdown()


def test_two_ranks_share_one_gpu_with_fractional_gpus_and_stay_in_step(ray_session):
    trainer = TorchTrainer(LinearOperator, num_workers=2, use_gpu=True, num_gpus_per_worker=0.5,
                           backend="gloo", use_fp16=True, config={BATCH_SIZE: 50})
    try:
        views = trainer.apply_all_workers(gpu_view)
        assert views[0]["ray_gpus"] == views[1]["ray_gpus"] and len(views[0]["ray_gpus"]) == 1
        assert views[0]["visible"] == views[1]["visible"] == views[0]["ray_gpus"][0]
        losses = [trainer.train()["train_loss"] for _ in range(4)]
        assert losses[-1] < losses[0]
        assert param_devices(trainer) == [["cuda:0"], ["cuda:0"]]
        weights = trainer.apply_all_operators(
            lambda op: getattr(op.model, "module", op.model).weight.item())
        assert weights[0] == weights[1]  # DDP over CUDA tensors kept the ranks in step
    finally:
        trainer.shutdown()


def test_fsdp_with_bf16_on_nccl_trains_and_resumes_from_disk(ray_session, tmp_path):
    from fsdp_operators import Block, StackOperator

    def make():
        return TorchTrainer(StackOperator, num_workers=1, use_gpu=True, use_fp16="bf16",
                            backend="nccl", strategy=FSDP(units=Block),
                            config={BATCH_SIZE: 32, "width": 64, "depth": 4, "lr": 1e-2})
    trainer = make()
    try:
        losses = [trainer.train()["train_loss"] for _ in range(3)]
        assert losses[-1] < losses[0]
        seen = trainer.apply_all_operators(lambda op: (
            str(op.model._get_fsdp_state()._mp_policy.param_dtype),
            sorted({type(p).__name__ + ":" + str(p.device) for p in op.model.parameters()})))
        assert seen == [("torch.bfloat16", ["DTensor:cuda:0"])]
        full = trainer.get_model()  # gathered to a plain fp32 module on the driver
        assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in full.parameters())
        path = trainer.save(str(tmp_path / "fsdp-gpu"))
        validated = trainer.validate()["val_loss"]
    finally:
        trainer.shutdown()
    resumed = make()
    try:
        resumed.load(path)
        assert abs(resumed.validate()["val_loss"] - validated) < 1e-3
    finally:
        resumed.shutdown()


class DeviceIdOperator(TrainingOperator):
    """Records the device of every Ray Data batch it is given."""

    def setup(self, config):
        model = torch.nn.Linear(1, 1)
        self.register(models=model, optimizers=torch.optim.SGD(model.parameters(), lr=1e-3),
                      criterion=torch.nn.MSELoss())
        self.devices = set()

    def train_batch(self, batch, batch_info):
        x, _ = batch
        self.devices.add(str(x.device))
        x = x.float().view(-1, 1)
        return super().train_batch((x, x.clone()), batch_info)


def test_ray_data_batches_arrive_on_the_gpu(ray_session):
    import ray.data
    from raysgd import DatasetConfig

    data = ray.data.from_items([{"x": float(i), "id": i} for i in range(200)])
    trainer = TorchTrainer(DeviceIdOperator, num_workers=1, use_gpu=True,
                           config={BATCH_SIZE: 20}, datasets={"train": data},
                           dataset_config=DatasetConfig(feature_columns=["x"], label_column="id"))
    try:
        assert trainer.train()["num_samples"] == 200
        assert trainer.apply_all_operators(lambda op: sorted(op.devices)) == [["cuda:0"]]
    finally:
        trainer.shutdown()


def test_a_lightning_module_trains_on_cuda_in_fp16(ray_session):
    from test_lightning import Regressor

    trainer = TorchTrainer(TrainingOperator.from_ptl(Regressor), num_workers=1, use_gpu=True,
                           use_fp16=True, config={"interval": "step"})
    try:
        first = trainer.train()
        second = trainer.train()
        assert second["train_loss"] < first["train_loss"]
        seen = trainer.apply_all_operators(
            lambda op: (str(op.get_model().device), type(op._context.precision).__name__))
        assert seen == [("cuda:0", "ScaledFp16Precision")]
    finally:
        trainer.shutdown()


def test_a_gpu_crew_is_reused_from_the_warm_pool(ray_session):
    def make():
        return TorchTrainer(LinearOperator, num_workers=1, use_gpu=True, spare_workers=0,
                            config={BATCH_SIZE: 50})
    first = make()
    first.train()
    before = first.apply_all_workers(gpu_view)
    first.shutdown()
    started = time.perf_counter()
    second = make()
    try:
        took = time.perf_counter() - started
        after = second.apply_all_workers(gpu_view)
        assert after[0]["pid"] == before[0]["pid"]
        assert after[0]["visible"] == before[0]["visible"]
        assert second.train()["epoch"] == 1
        assert param_devices(second) == [["cuda:0"]]
        print(f"\nGPU crew from the warm pool: second trainer ready in {took:.2f} s")
    finally:
        second.shutdown()


def test_a_gpu_spare_holds_no_gpu_and_takes_the_dead_ranks_device(ray_session):
    import ray

    trainer = TorchTrainer(LinearOperator, num_workers=1, use_gpu=True, use_fp16=True,
                           backend="nccl", spare_workers=1, config={BATCH_SIZE: 50})
    try:
        first = trainer.train()["train_loss"]
        spare = trainer._supervisor.group.spares[0]
        ray.get(spare.ready, timeout=120)
        spare_info = ray.get(spare.actor.node_info.remote())
        assert spare_info["devices"] == []  # holds no GPU while it waits
        assert ray.available_resources().get("GPU", 0) == 0  # the rank's bundle keeps it
        before = trainer.apply_all_workers(gpu_view)[0]
        os.kill(before["pid"], signal.SIGKILL)
        killed = time.perf_counter()
        trainer.train(num_steps=1)
        took = time.perf_counter() - killed
        after = trainer.apply_all_workers(gpu_view)[0]
        assert after["pid"] == spare_info["pid"] and after["visible"] == before["visible"]
        assert param_devices(trainer) == [["cuda:0"]]
        assert trainer.recovery_stats.recoveries == 1
        assert trainer.train()["train_loss"] < first  # it trains on from the commit
        print(f"\nGPU spare: kill → one step done in {took:.2f} s")
    finally:
        trainer.shutdown()
