"""Precision modes, loss scaling, clipping and accumulation, in-process on CPU (no Ray)."""
import pickle
import warnings

import pytest
import torch
from torch import nn

from operators_for_tests import ConvOperator, LinearOperator, PrecisionGANOperator
from raysgd import TorchTrainer
from raysgd.config import RankInfo, WorkerSettings
from raysgd.errors import ConfigError
from raysgd.utils import BATCH_SIZE
from raysgd.worker import precision
from raysgd.worker.batches import split_batch
from raysgd.worker.runner import WorkerRunner


def make_runner(cls, config=None, **settings):
    runner = WorkerRunner(cls, dict(config or {}), WorkerSettings(**settings), RankInfo())
    runner.setup_operator()
    return runner


def train(runner, epochs):
    return [runner.train_epoch() for _ in range(epochs)]


# ------------------------------------------------------------------ choices
def test_each_mode_resolves_to_one_precision_object():
    cpu = torch.device("cpu")
    assert precision.create_precision(False, cpu).name == "fp32"
    assert precision.create_precision("bf16", cpu).dtype is torch.bfloat16
    fp16 = precision.create_precision("fp16", cpu)
    assert isinstance(fp16, precision.ScaledFp16Precision) and fp16.scale > 1


def test_use_fp16_true_on_cpu_warns_once_and_uses_bf16(monkeypatch):
    monkeypatch.setattr(precision, "_warned_cpu_fp16", False)
    with pytest.warns(UserWarning, match="bf16 autocast instead of fp16"):
        first = make_runner(LinearOperator, {BATCH_SIZE: 100}, use_fp16=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_runner(LinearOperator, {BATCH_SIZE: 100}, use_fp16=True)  # silent the second time
    assert first.operator._context.precision.dtype is torch.bfloat16
    losses = [m["train_loss"] for m in train(first, 5)]
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("value", ["fp32", 16, "O1", None])
def test_invalid_modes_are_rejected_at_construction(value):
    with pytest.raises(ConfigError, match="use_fp16"):
        WorkerSettings(use_fp16=value)


def test_apex_without_apex_fails_on_the_driver_before_any_worker():
    class NeverStarted:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a worker group was created")

        @staticmethod
        def cluster_gpus():
            return 0

    with pytest.raises(ConfigError, match="Native torch.amp is the supported path"):
        TorchTrainer(training_operator_cls=LinearOperator, use_fp16="apex", use_gpu=False,
                     _worker_group_cls=NeverStarted)


@pytest.mark.parametrize("kwargs, match", [({"clip_grad_norm": 0}, "clip_grad_norm"),
                                           ({"clip_grad_norm": True}, "clip_grad_norm"),
                                           ({"accumulate_steps": 0}, "accumulate_steps"),
                                           ({"accumulate_steps": 2.5}, "accumulate_steps")])
def test_bad_clip_and_accumulation_settings_are_rejected(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        WorkerSettings(**kwargs)


# -------------------------------------------------------------- convergence
@pytest.mark.parametrize("cls, config, epochs", [
    (LinearOperator, {BATCH_SIZE: 50}, 8),
    (ConvOperator, {BATCH_SIZE: 64}, 12),
])
def test_bf16_converges_like_fp32(cls, config, epochs):
    """Stated tolerance: the final bf16 training loss is within 15% (+0.02) of fp32's,
    and both fell to under half of their first epoch's."""
    results = {}
    for mode in (False, "bf16"):
        runner = make_runner(cls, config, use_fp16=mode)
        metrics = train(runner, epochs)
        results[mode] = [m["train_loss"] for m in metrics]
        val = runner.validate()
        assert isinstance(val["val_loss"], float)  # metrics come back as fp32 Python numbers
    fp32, bf16 = results[False], results["bf16"]
    for losses in (fp32, bf16):
        assert losses[-1] < 0.5 * losses[0]
    assert abs(bf16[-1] - fp32[-1]) <= 0.15 * fp32[-1] + 0.02


def test_fp16_with_loss_scaling_trains_on_cpu():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 50}, use_fp16="fp16")
    losses = [m["train_loss"] for m in train(runner, 6)]
    assert losses[-1] < 0.5 * losses[0]


def test_gan_loop_with_helpers_trains_both_models_in_each_mode():
    for mode in (False, "bf16", "fp16"):
        runner = make_runner(PrecisionGANOperator, {BATCH_SIZE: 64}, use_fp16=mode)
        before = [[p.detach().clone() for p in m.parameters()] for m in runner.operator.models]
        metrics = train(runner, 6)
        for model, old in zip(runner.operator.models, before):
            assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), old)), mode
        # The generator's samples move towards the real data (mean 2.0). A GAN's distance
        # oscillates from epoch to epoch, so the closest epoch is compared, not the last.
        distances = [m["mean_distance"] for m in metrics]
        assert min(distances[1:]) < 0.6 * distances[0], (mode, distances)


# ------------------------------------------------------------ loss scaling
def test_overflow_skips_the_step_and_lowers_the_scale():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100}, use_fp16="fp16")
    op = runner.operator
    scaler_precision = op._context.precision
    scale = scaler_precision.scale
    weights = [p.detach().clone() for p in op.model.parameters()]
    x, y = torch.ones(4, 1), torch.ones(4, 1)
    op.optimizer.zero_grad()
    with op.autocast():
        loss = op.criterion(op.model(x), y) * float("inf")
    op.backward(loss)
    skipped = op.step(op.optimizer)  # its overflow flags are read when it is tested
    assert bool(skipped) is False and not skipped and skipped == False  # noqa: E712
    assert pickle.loads(pickle.dumps(skipped)) is False  # a metric holding it pickles a bool
    assert all(torch.equal(p, q) for p, q in zip(op.model.parameters(), weights))
    op.optimizer.zero_grad()
    with op.autocast():
        loss = op.criterion(op.model(x), y)
    op.backward(loss)  # the deferred update lands before this backward
    assert scaler_precision.scale == scale * 0.5
    assert bool(skipped) is False  # its record outlives the scaler's update
    assert bool(op.step(op.optimizer)) is True


def test_the_default_step_leaves_its_loss_a_tensor_for_the_meters():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100}, use_fp16="fp16")
    op = runner.operator
    metrics = op.train_batch((torch.ones(4, 1), torch.ones(4, 1)), {"batch_idx": 0})
    loss = metrics["train_loss"]
    assert isinstance(loss, torch.Tensor) and loss.ndim == 0 and not loss.requires_grad
    assert metrics["num_samples"] == 4 and float(loss) >= 0


def test_scaler_state_round_trips_through_save_and_load(tmp_path):
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100}, use_fp16="fp16")
    train(runner, 2)
    prec = runner.operator._context.precision
    prec.state_dict()  # lands the deferred update
    prec.scaler.update(1024.0)  # a non-default scale
    state = runner.state_dict()
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    fresh = make_runner(LinearOperator, {BATCH_SIZE: 100}, use_fp16="fp16")
    fresh.load_state_dict(torch.load(path, weights_only=True))
    old, new = runner.operator._context.precision.scaler, fresh.operator._context.precision.scaler
    assert new.get_scale() == old.get_scale() == 1024.0
    assert new.state_dict() == old.state_dict()


# ----------------------------------------------------------------- clipping
class ClipProbe(LinearOperator):
    def train_batch(self, batch, batch_info):
        metrics = super().train_batch(batch, batch_info)
        grads = [p.grad for p in self.model.parameters()]
        return {**metrics, "grad_norm": torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads])).item()}


@pytest.mark.parametrize("mode", [False, "fp16"])
def test_clipping_bounds_the_gradient_norm(mode):
    config = {BATCH_SIZE: 100, "lr": 1e-4}
    free = make_runner(ClipProbe, config, use_fp16=mode).train_epoch()
    clipped = make_runner(ClipProbe, config, use_fp16=mode, clip_grad_norm=0.5).train_epoch()
    assert free["last_grad_norm"] > 5  # large unclipped gradients: the bound below means something
    assert clipped["last_grad_norm"] <= 0.5 * (1 + 1e-3)


def test_clip_grad_norm_helper_returns_the_norm_before_clipping():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100})
    op = runner.operator
    for p in op.model.parameters():
        p.grad = torch.full_like(p, 3.0)
    norm = op.clip_grad_norm_(op.model, 1.0)
    assert norm.item() == pytest.approx((2 * 9.0) ** 0.5)
    total = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in op.model.parameters()]))
    assert total.item() == pytest.approx(1.0, rel=1e-5)


# ------------------------------------------------------------- accumulation
def test_split_batch_keeps_structure_and_weights():
    batch = (torch.arange(10).float().unsqueeze(1), {"y": torch.arange(10)})
    pieces = split_batch(batch, 3)
    assert [w for _, w in pieces] == [0.3, 0.4, 0.3]
    assert torch.equal(torch.cat([p[0] for p, _ in pieces]), batch[0])
    assert torch.equal(torch.cat([p[1]["y"] for p, _ in pieces]), batch[1]["y"])
    assert len(split_batch(torch.zeros(2, 1), 4)) == 2  # never an empty micro-batch
    assert split_batch(batch, 1) == [(batch, 1)]
    with pytest.raises(ConfigError, match="(?i)override train_batch"):
        split_batch(["a", "b"], 2)


@pytest.mark.parametrize("mode", [False, "bf16"])
def test_accumulating_k_micro_batches_equals_one_step_on_the_whole_batch(mode):
    config = {BATCH_SIZE: 100}
    whole = make_runner(LinearOperator, config, use_fp16=mode)
    micro = make_runner(LinearOperator, config, use_fp16=mode, accumulate_steps=4)
    a, b = train(whole, 3), train(micro, 3)
    tolerance = 1e-6 if mode is False else 2e-2
    for p, q in zip(whole.operator.model.parameters(), micro.operator.model.parameters()):
        assert torch.allclose(p, q, rtol=tolerance, atol=tolerance)
    assert b[-1]["train_loss"] == pytest.approx(a[-1]["train_loss"], rel=tolerance, abs=tolerance)
    assert b[-1]["num_samples"] == a[-1]["num_samples"] == 1000


def test_micro_batches_helper_in_a_custom_loop():
    class Custom(LinearOperator):
        def train_batch(self, batch, batch_info):
            self.optimizer.zero_grad()
            seen = 0
            for (x, y), weight in self.micro_batches(batch, 5):
                with self.autocast():
                    loss = self.criterion(self.model(x), y)
                self.backward(loss * weight)
                seen += len(x)
            self.step(self.optimizer)
            return {"seen": seen, "num_samples": seen}

    runner = make_runner(Custom, {BATCH_SIZE: 100})
    assert runner.train_epoch()["seen"] == 100
    assert isinstance(runner.operator.model, nn.Linear)  # no DDP at world size 1: no_sync is a no-op
