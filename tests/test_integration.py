"""Real Ray, real gloo process groups, 2 worker processes."""
import os
import warnings

import pytest
import torch
from torch import nn

from operators_for_tests import (CustomWrapperOperator, FailingOperator, GANOperator, LinearOperator,
                                 NoDataOperator, NoRegisterOperator, PrecisionGANOperator,
                                 SetupFailOperator, SyncCountingOperator, UnevenOperator,
                                 WrongReturnOperator)
from raysgd import TorchTrainer
from raysgd.errors import ConfigError, ResourcesUnavailableError, TrainerShutdownError
from raysgd.torch import TrainingOperator
from raysgd.torch.examples.train_example import (data_creator, model_creator, optimizer_creator,
                                                 scheduler_creator)
from raysgd.utils import BATCH_SIZE

pytestmark = pytest.mark.timeout(180)


def params_per_worker(trainer):
    return trainer.apply_all_operators(
        lambda op: [p.detach().clone() for p in op._original_models[0].parameters()])


def test_two_workers_train_with_ddp_and_sharded_data(trainer_factory):
    trainer = trainer_factory(config={"lr": 1e-2, BATCH_SIZE: 64, "shuffle": True},
                              scheduler_step_freq="epoch")
    first = trainer.train()
    assert first["epoch"] == 1 and first["num_samples"] == 1000
    assert first["batch_count"] == 16  # 500 samples per worker, 32 per batch
    for _ in range(3):
        last = trainer.train()
    assert last["epoch"] == 4 and last["train_loss"] < first["train_loss"]
    rank0, rank1 = params_per_worker(trainer)
    for a, b in zip(rank0, rank1):
        assert torch.equal(a, b)  # DDP kept the replicas identical
    info = trainer.apply_all_operators(
        lambda op: (op.world_rank, op.local_rank, op.world_size, type(op.model).__name__,
                    type(op.train_loader.sampler).__name__, op.config[BATCH_SIZE]))
    assert info == [(0, 0, 2, "DistributedDataParallel", "DistributedSampler", 32),
                    (1, 1, 2, "DistributedDataParallel", "DistributedSampler", 32)]
    val = trainer.validate()
    assert val["num_samples"] == 400 and {"val_loss", "val_accuracy"} <= val.keys()
    per_worker = trainer.validate(reduce_results=False)
    assert [r["num_samples"] for r in per_worker] == [200, 200]


def test_metrics_are_weighted_by_each_workers_samples(trainer_factory):
    trainer = trainer_factory(UnevenOperator, add_dist_sampler=False, config={"nan_rank": None})
    result = trainer.train()
    # rank 0: 10 samples of loss 0, rank 1: 20 samples of loss 1 → 2/3, not 0.5
    assert result["num_samples"] == 30
    assert result["loss"] == pytest.approx(2 / 3)
    assert result["tag"] == "rank0"
    per_worker = trainer.train(reduce_results=False)
    assert [r["num_samples"] for r in per_worker] == [10, 20]


def test_nan_on_one_worker_propagates(trainer_factory):
    import math

    trainer = trainer_factory(UnevenOperator, add_dist_sampler=False, config={"nan_rank": 1})
    assert math.isnan(trainer.train()["loss"])


def test_num_steps_continue_across_calls(trainer_factory):
    trainer = trainer_factory(config={BATCH_SIZE: 200})  # 5 batches per worker per pass
    assert trainer.train(num_steps=3)["batch_count"] == 3
    rest = trainer.train()
    assert rest["batch_count"] == 2 and rest["epoch"] == 1
    wrapped = trainer.train(num_steps=7)
    assert wrapped["batch_count"] == 7 and wrapped["epoch"] == 3
    assert trainer.validate(num_steps=1)["batch_count"] == 1


def test_save_load_across_trainers_and_worker_counts(trainer_factory, tmp_path, caplog):
    caplog.set_level("INFO", logger="raysgd")
    trainer = trainer_factory(config={BATCH_SIZE: 64, "note": "from-two"})
    for _ in range(3):
        trainer.train()
    val = trainer.validate()
    path = trainer.save(str(tmp_path / "ck.pt"))
    model = trainer.get_model()
    assert isinstance(model, nn.Linear)  # unwrapped from DDP
    trainer.shutdown()

    single = trainer_factory(num_workers=1, config={BATCH_SIZE: 64, "seed": 5})
    single.load(path)
    assert single.validate()["val_loss"] == pytest.approx(val["val_loss"], rel=1e-5)
    assert single.apply_all_operators(lambda op: op.loaded_note) == ["from-two"]
    lifecycle = [r.getMessage() for r in caplog.records if r.name == "raysgd"]
    assert any("2 worker(s) ready" in m for m in lifecycle), lifecycle
    assert any(f"checkpoint written to {path}" in m for m in lifecycle), lifecycle
    assert any("loaded into 1 worker(s)" in m for m in lifecycle), lifecycle
    assert single.train()["epoch"] == 4
    restored = single.get_model()
    assert not torch.equal(restored.weight, model.weight)  # it kept training


def test_accumulation_all_reduces_once_per_step_and_matches_whole_batches(trainer_factory):
    config = {BATCH_SIZE: 64}
    whole = trainer_factory(SyncCountingOperator, config=config)
    micro = trainer_factory(SyncCountingOperator, config=config, accumulate_steps=4)
    a, b = whole.train(), micro.train()
    assert a["allreduces"] == b["allreduces"] == 1  # 4 micro-batches, still one all-reduce
    assert b["num_samples"] == a["num_samples"] == 1000
    for p, q in zip(params_per_worker(whole)[0], params_per_worker(micro)[0]):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6)
    rank0, rank1 = params_per_worker(micro)
    assert all(torch.equal(p, q) for p, q in zip(rank0, rank1))


def test_fp16_gan_with_clipping_on_two_workers_keeps_scaler_state(trainer_factory, tmp_path):
    trainer = trainer_factory(PrecisionGANOperator, config={BATCH_SIZE: 64}, use_fp16="fp16")
    first = trainer.train()
    for _ in range(3):
        last = trainer.train()
    assert last["mean_distance"] < first["mean_distance"]
    scales = trainer.apply_all_operators(lambda op: op._context.precision.state_dict())
    assert scales[0] == scales[1]
    path = str(tmp_path / "gan.ckpt")
    trainer.save(path)
    fresh = trainer_factory(PrecisionGANOperator, config={BATCH_SIZE: 64}, use_fp16="fp16",
                            num_workers=1)
    fresh.load(path)
    assert fresh.apply_all_operators(
        lambda op: op._context.precision.state_dict())[0] == scales[0]


def test_use_local_runs_rank_zero_in_the_driver(trainer_factory):
    trainer = trainer_factory(use_local=True, config={BATCH_SIZE: 64})
    trainer.train()
    local = trainer.get_local_operator()
    assert local.world_rank == 0 and local.world_size == 2
    pids = trainer.apply_all_workers(os.getpid)
    assert pids[0] == os.getpid() and pids[1] != os.getpid()
    rank0, rank1 = params_per_worker(trainer)
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1))


def test_single_local_worker_needs_no_process_group(trainer_factory):
    import torch.distributed as dist

    trainer = trainer_factory(num_workers=1, use_local=True, config={BATCH_SIZE: 100})
    assert trainer.train()["num_samples"] == 1000
    assert not dist.is_initialized()
    assert isinstance(trainer.get_local_operator().model, nn.Linear)


def test_initialization_hook_runs_on_every_worker(trainer_factory):
    def hook():
        os.environ["RAYSGD_HOOK_RAN"] = "yes"

    for num_workers in (1, 2):
        trainer = trainer_factory(num_workers=num_workers, initialization_hook=hook)
        assert trainer.apply_all_workers(lambda: os.environ.get("RAYSGD_HOOK_RAN")) == ["yes"] * num_workers
        trainer.shutdown()


def test_gan_operator_with_two_models(trainer_factory):
    trainer = trainer_factory(GANOperator, config={"latent_dim": 2, BATCH_SIZE: 64})
    result = trainer.train()
    assert {"loss_g", "loss_d", "last_loss_g", "last_loss_d"} <= result.keys()
    assert result["num_samples"] == 256
    models = trainer.get_model()
    assert [type(m).__name__ for m in models] == ["Discriminator", "Generator"]


def test_wrap_ddp_false_with_a_custom_wrapper(trainer_factory):
    trainer = trainer_factory(CustomWrapperOperator, wrap_ddp=False, config={BATCH_SIZE: 64})
    result = trainer.train()
    assert result["is_ddp"] == 0.0 and "loss" in result
    rank0, rank1 = params_per_worker(trainer)
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1))


def test_from_creators_and_legacy_creator_keywords(trainer_factory):
    operator = TrainingOperator.from_creators(
        model_creator=model_creator, optimizer_creator=optimizer_creator,
        data_creator=data_creator, loss_creator=nn.MSELoss, scheduler_creator=scheduler_creator)
    trainer = trainer_factory(operator, scheduler_step_freq="epoch", config={"lr": 1e-2, BATCH_SIZE: 64})
    assert trainer.train()["num_samples"] == 1000
    trainer.shutdown()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = TorchTrainer(model_creator=model_creator, data_creator=data_creator,
                               optimizer_creator=optimizer_creator, loss_creator=nn.MSELoss,
                               config={"lr": 1e-2, BATCH_SIZE: 64}, num_workers=2, use_gpu=False)
    try:
        assert any(issubclass(w.category, DeprecationWarning) for w in caught)
        losses = [trainer.train()["train_loss"] for _ in range(3)]
        assert losses[-1] < losses[0]
        assert trainer.validate()["num_samples"] == 400
    finally:
        trainer.shutdown()


def test_user_exception_in_train_batch_keeps_type_and_rank(trainer_factory):
    trainer = trainer_factory(FailingOperator, config={"fail_rank": 1, BATCH_SIZE: 64})
    with pytest.raises(ValueError, match="bad batch on rank 1") as info:
        trainer.train()
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "rank 1" in notes and "train_batch" in notes  # the worker traceback
    # The workers were rolled back, not stopped: the trainer still answers.
    assert trainer.recovery_stats.user_errors == 1
    assert trainer.validate()["num_samples"] == 400
    with pytest.raises(ValueError, match="bad batch on rank 1"):
        trainer.train()


def test_a_wrong_hook_return_is_a_config_error_and_leaves_the_weights(trainer_factory):
    trainer = trainer_factory(WrongReturnOperator, config={BATCH_SIZE: 64})
    trainer.train(num_steps=2)
    before = params_per_worker(trainer)
    steps = trainer.apply_all_operators(lambda op: op.global_step)
    with pytest.raises(ConfigError, match=r"^WrongReturnOperator\.train_batch returned float "
                                          r"\(0\.25\); it must return a dict of metrics") as info:
        trainer.train(info={"bad_return": 0.25})  # batch 0 stepped on both ranks, then 0.25
    assert "train_batch" in "\n".join(info.value.__notes__)  # the worker's traceback
    stats = trainer.recovery_stats
    assert stats.user_errors == 1 and stats.failures == 0  # the user's error: not retried
    after = params_per_worker(trainer)
    for rank_before, rank_after in zip(before, after):
        assert all(torch.equal(a, b) for a, b in zip(rank_before, rank_after))
    assert trainer.apply_all_operators(lambda op: op.global_step) == steps == [2, 2]
    with pytest.raises(ConfigError, match=r"^WrongReturnOperator\.validate_batch returned str"):
        trainer.validate(info={"bad_return": "ok"})
    result = trainer.train()  # the pass's remaining 14 batches of 32 per rank
    assert result["batch_count"] == 14 and result["epoch"] == 1 and "train_loss" in result
    trained = params_per_worker(trainer)
    assert not all(torch.equal(a, b) for a, b in zip(before[0], trained[0]))
    assert all(torch.equal(a, b) for a, b in zip(trained[0], trained[1]))


def test_user_exception_in_setup_keeps_type_and_rank(ray_cpus):
    with pytest.raises(KeyError, match="missing-key-in-setup") as info:
        TorchTrainer(training_operator_cls=SetupFailOperator, num_workers=2, use_gpu=False,
                     config={"fail_rank": 1})
    assert "raised on rank 1" in "\n".join(info.value.__notes__)


def test_operator_without_register_names_the_rank(ray_cpus):
    with pytest.raises(ConfigError, match="did not call self.register") as info:
        TorchTrainer(training_operator_cls=NoRegisterOperator, num_workers=2, use_gpu=False)
    assert "raised on rank" in "\n".join(info.value.__notes__)


def test_missing_loaders_are_reported_on_the_driver(trainer_factory):
    trainer = trainer_factory(NoDataOperator)
    with pytest.raises(ConfigError, match="train_loader"):
        trainer.train()
    with pytest.raises(ConfigError, match="validation_loader"):
        trainer.validate()
    assert trainer.apply_all_workers(lambda: 1) == [1, 1]  # workers untouched


def test_more_workers_than_the_cluster_holds_fails_fast(ray_cpus):
    with pytest.raises(ResourcesUnavailableError, match="whole cluster has CPU: 4"):
        TorchTrainer(training_operator_cls=LinearOperator, num_workers=8, use_gpu=False)
    with pytest.raises(ResourcesUnavailableError, match="CPU: 5 in all"):
        TorchTrainer(training_operator_cls=LinearOperator, num_workers=1, num_cpus_per_worker=5,
                     use_gpu=False)


def test_busy_cluster_fails_after_a_bounded_wait(trainer_factory):
    trainer_factory(num_workers=3)  # holds 3 of the 4 CPUs
    with pytest.raises(ResourcesUnavailableError, match="within 2s"):
        TorchTrainer(training_operator_cls=LinearOperator, num_workers=2, use_gpu=False,
                     placement_timeout_s=2)


def test_apply_errors_do_not_kill_the_workers(trainer_factory):
    trainer = trainer_factory()

    def boom():
        raise RuntimeError("user fn failed")

    with pytest.raises(RuntimeError, match="user fn failed"):
        trainer.apply_all_workers(boom)
    assert trainer.train()["num_samples"] == 1000


def test_manual_scheduler_update(trainer_factory):
    trainer = trainer_factory(scheduler_step_freq="manual", config={"scheduler": True})
    trainer.update_scheduler(0.1)
    lrs = trainer.apply_all_operators(lambda op: op.optimizer.param_groups[0]["lr"])
    assert lrs == [pytest.approx(0.005)] * 2


@pytest.mark.slow
@pytest.mark.parametrize("use_local", [False, True])
def test_a_killed_worker_with_max_retries_0_raises_the_typed_error(trainer_factory, use_local):
    import signal
    import threading
    import time

    from operators_for_tests import SlowOperator
    from raysgd.errors import RetriesExhaustedError

    trainer = trainer_factory(SlowOperator, use_local=use_local, timeout_s=120,
                              config={BATCH_SIZE: 20, "sleep_s": 0.05})
    victim = trainer.apply_all_workers(os.getpid)[1]
    threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
    started = time.monotonic()
    with pytest.raises(RetriesExhaustedError) as info:
        trainer.train(max_retries=0)
    assert time.monotonic() - started < 30  # not the 120 s process-group timeout
    assert 1 in info.value.ranks and "max_retries=0" in str(info.value)
    assert any(f.died for f in info.value.failures if f.rank == 1)
    with pytest.raises(TrainerShutdownError):
        trainer.train()


def test_the_commit_interval_is_chosen_from_what_commits_cost(trainer_factory):
    """checkpoint_every_n_steps="auto" (the default): the first call commits every 50 steps,
    later ones as far apart as keeps the measured commits within 2 % of the training time.
    Every rank uses the interval the driver chose, and profile= reports it."""
    trainer = trainer_factory(config={BATCH_SIZE: 16})  # 32 steps per rank and pass
    first = trainer.train(num_steps=60, profile=True)["profile"]
    assert first["commit_interval"] == 50 and first["commits"] == 1  # at step 50
    chosen = trainer.recovery_stats.commit_interval
    assert isinstance(chosen, int) and chosen >= 1
    second = trainer.train(num_steps=60, profile=True)["profile"]
    assert second["commit_interval"] == chosen
    assert second["commits"] == len([s for s in range(61, 121) if s % chosen == 0])
    forced = trainer_factory(config={BATCH_SIZE: 16}, checkpoint_every_n_steps=7)
    assert forced.train(num_steps=20, profile=True)["profile"]["commit_interval"] == 7
    assert forced.recovery_stats.commit_interval == 7
