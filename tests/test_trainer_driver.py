"""TorchTrainer logic with an injected fake worker group: no Ray, no processes."""
import warnings

import pytest

from operators_for_tests import LinearOperator
from raysgd import TorchTrainer
from raysgd.driver.replicas import NO_COPIES
from raysgd.errors import (ConfigError, RankFailure, RetriesExhaustedError, TrainerShutdownError,
                           WorkerFailedError)
from raysgd.torch.examples import train_example
from raysgd.utils import BATCH_SIZE


class FakeWorkerGroup:
    """Stands in for WorkerGroup; answers each method from ``responses``."""

    instances = []
    train_script = []  # responses to train_epoch, consumed across group instances
    placeable_script = []

    def __init__(self, operator_cls, config_for_rank, settings, num_workers, use_local=False,
                 initialization_hook=None, placement_timeout_s=60.0, reservation=None,
                 placement_strategy="PACK", workers_per_host=None, warm=None, data=None):
        self.operator_cls, self.config_for_rank = operator_cls, config_for_rank
        self.settings, self.num_workers = settings, num_workers
        self.calls, self.shut, self.local_runner = [], False, None
        self.capabilities = {"has_train_loader": True, "has_validation_loader": True, "num_models": 1}
        self.responses = {"progress": [{"steps": 0, "first_step_wall": None}] * num_workers}
        self.placeable = num_workers
        self.left_running = False
        FakeWorkerGroup.instances.append(self)

    def start(self):
        return [dict(self.capabilities) for _ in range(self.num_workers)]

    def copy_commit(self, commit):
        return NO_COPIES  # one node: every commit is restorable at once

    def execute(self, method, *args, abort_on_failure=True, watch=None):
        self.calls.append((method, args))
        if method == "train_epoch" and FakeWorkerGroup.train_script:
            response = FakeWorkerGroup.train_script.pop(0)
        else:
            response = self.responses.get(method, [None] * self.num_workers)
        if isinstance(response, BaseException):
            raise response
        return response

    def execute_single(self, rank, method, *args):
        return self.execute(method, *args)[rank]

    def put(self, obj):
        return obj

    def execute_pair(self, method, *args, watch=None):
        from raysgd.state.commit import Commit

        if method == "train_and_commit":
            # The last two: the call's ticket and its commit interval.
            metrics = self.execute("train_epoch", *args[:-2])
            headers = [{"step": 0, "call_done": 0, "metrics": m, "first_step_wall": None}
                       for m in metrics]
        else:
            headers = [{"step": 0, "call_done": 0}] * self.num_workers
        return headers, Commit(0, 0, self.num_workers, ["snap"] * self.num_workers)

    def snapshot(self):
        return self.execute_pair("snapshot_pair")[1]

    def restore(self, commit, renew_shards=False):
        self.calls.append(("restore", (commit,)))

    def watch(self, timeout_s, committed_step, on_commit=None, on_progress=None, on_tick=None):
        from types import SimpleNamespace

        return SimpleNamespace(monitor=SimpleNamespace(reports={}), ticket=1)

    def placeable_workers(self, want=0):
        if FakeWorkerGroup.placeable_script:
            return FakeWorkerGroup.placeable_script.pop(0)
        return self.placeable

    @staticmethod
    def cluster_gpus():
        return 0.0

    def shutdown(self, force=False):
        self.shut = True

    def can_replace(self, ranks):
        return False  # no spares: recovery always starts a new group here

    def survivor_commit(self, dead, commit):
        self.calls.append(("survivor_commit", (dead, commit.step)))
        return None  # the survivors' state moved: the commit is restored

    def refill_spares(self, avoid=()):
        pass


def make(num_workers=2, **kwargs):
    FakeWorkerGroup.instances.clear()
    trainer = TorchTrainer(training_operator_cls=LinearOperator, num_workers=num_workers,
                           use_gpu=False, _worker_group_cls=FakeWorkerGroup, **kwargs)
    return trainer, FakeWorkerGroup.instances[-1]


def test_train_reduces_worker_results_weighted_by_samples():
    trainer, group = make()
    group.responses["train_epoch"] = [
        {"epoch": 1, "num_samples": 10, "batch_count": 1, "train_loss": 1.0},
        {"epoch": 1, "num_samples": 30, "batch_count": 3, "train_loss": 2.0}]
    result = trainer.train(num_steps=5, profile=True, info={"a": 1})
    assert result["train_loss"] == pytest.approx(1.75) and result["num_samples"] == 40
    assert group.calls[-1] == ("train_epoch", (5, True, {"a": 1}, False))
    assert trainer.train(reduce_results=False) == group.responses["train_epoch"]


def test_batch_size_split_and_rewrite_when_not_divisible():
    with pytest.warns(UserWarning, match="not divisible"):
        trainer, group = make(num_workers=3, config={BATCH_SIZE: 100, "lr": 0.1})
    assert trainer.config[BATCH_SIZE] == 99
    assert group.config_for_rank(0) == {BATCH_SIZE: 33, "lr": 0.1}
    trainer, group = make(num_workers=4, config={BATCH_SIZE: 128})
    assert group.config_for_rank(3)[BATCH_SIZE] == 32


def test_user_config_is_not_mutated():
    config = {BATCH_SIZE: 100}
    with pytest.warns(UserWarning):
        make(num_workers=3, config=config)
    assert config == {BATCH_SIZE: 100}


def test_missing_loader_fails_on_the_driver_without_calling_workers():
    trainer, group = make()
    trainer._supervisor.capabilities = [dict(group.capabilities, has_validation_loader=False)] * 2
    with pytest.raises(ConfigError, match="validation_loader"):
        trainer.validate()
    assert not any(call[0] == "validate" for call in group.calls)


def test_bad_num_steps_is_rejected_on_the_driver():
    trainer, _ = make()
    for bad in (0, -1, 2.5, "3"):
        with pytest.raises(ConfigError, match="num_steps"):
            trainer.train(num_steps=bad)


def test_worker_failure_without_retries_closes_the_trainer_with_a_clear_error():
    trainer, group = make()
    group.responses["train_epoch"] = WorkerFailedError(
        "Worker(s) failed", [RankFailure(1, RuntimeError("died"), died=True)])
    with pytest.raises(RetriesExhaustedError) as info:
        trainer.train(max_retries=0)
    assert info.value.ranks == (1,)
    assert "max_retries=0" in str(info.value)
    assert group.shut
    with pytest.raises(TrainerShutdownError, match="RetriesExhaustedError in train_epoch"):
        trainer.validate()


def test_every_method_raises_after_shutdown():
    trainer, group = make()
    trainer.shutdown()
    assert group.shut
    trainer.shutdown()  # idempotent
    for call in (trainer.train, trainer.validate, trainer.get_model, trainer.state_dict,
                 lambda: trainer.save("/tmp/x.pt"), lambda: trainer.update_scheduler(1),
                 lambda: trainer.apply_all_workers(lambda: 1), lambda: trainer.load_state_dict({})):
        with pytest.raises(TrainerShutdownError, match="create a new TorchTrainer"):
            call()


@pytest.mark.parametrize("kwargs, fragment", [
    ({"num_workers": 0}, "num_workers"),
    ({"scheduler_step_freq": "sometimes"}, "scheduler_step_freq"),
    ({"backend": "mpi"}, "backend"),
    ({"use_fp16": "half"}, "use_fp16"),
    ({"use_fp16": "apex"}, "Native torch.amp"),
    ({"use_gpu": "maybe"}, "use_gpu"),
    ({"config": [1, 2]}, "config must be a dict"),
    ({"initialization_hook": "not callable"}, "initialization_hook"),
    ({"timeout_s": -5}, "timeout_s"),
])
def test_bad_arguments_fail_before_any_worker_starts(kwargs, fragment):
    FakeWorkerGroup.instances.clear()
    args = {"training_operator_cls": LinearOperator, "use_gpu": False,
            "_worker_group_cls": FakeWorkerGroup, **kwargs}
    with pytest.raises(ConfigError, match=fragment):
        TorchTrainer(**args)
    assert FakeWorkerGroup.instances == []


def test_operator_class_is_checked():
    with pytest.raises(ConfigError, match="pass the class itself"):
        TorchTrainer(training_operator_cls=object.__new__(LinearOperator),
                     _worker_group_cls=FakeWorkerGroup, use_gpu=False)
    with pytest.raises(ConfigError, match="subclass of raysgd.torch.TrainingOperator"):
        TorchTrainer(training_operator_cls=dict, _worker_group_cls=FakeWorkerGroup, use_gpu=False)
    with pytest.raises(ConfigError, match="training_operator_cls"):
        TorchTrainer(_worker_group_cls=FakeWorkerGroup, use_gpu=False)


def test_creator_keywords_warn_and_build_an_operator():
    with pytest.warns(DeprecationWarning, match="deprecated"):
        trainer = TorchTrainer(model_creator=train_example.model_creator,
                               optimizer_creator=train_example.optimizer_creator,
                               data_creator=train_example.data_creator,
                               _worker_group_cls=FakeWorkerGroup, use_gpu=False)
    assert trainer.operator_cls._model_creator is train_example.model_creator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ConfigError, match="optimizer_creator"):
            TorchTrainer(model_creator=train_example.model_creator,
                         _worker_group_cls=FakeWorkerGroup, use_gpu=False)
        with pytest.raises(ConfigError, match="not both"):
            TorchTrainer(LinearOperator, model_creator=train_example.model_creator,
                         _worker_group_cls=FakeWorkerGroup, use_gpu=False)


def test_get_model_unwraps_single_and_keeps_lists():
    trainer, group = make()
    group.responses["get_models"] = [["m"], None]
    assert trainer.get_model() == "m"
    group.responses["get_models"] = [["d", "g"], None]
    assert trainer.get_model() == ["d", "g"]


def test_get_local_operator_needs_use_local():
    trainer, _ = make()
    with pytest.raises(ConfigError, match="use_local=True"):
        trainer.get_local_operator()


def test_save_and_load_go_through_the_group(tmp_path):
    import torch

    trainer, group = make()
    state = {"models": [{"w": torch.ones(1)}], "optimizers": [{}], "epoch": 2}
    group.responses["state_dict"] = [state, None]
    path = trainer.save(str(tmp_path / "a" / "ck.pt"))
    trainer.load(path)
    method, (loaded,) = group.calls[-1]
    assert method == "load_state_dict" and loaded["epoch"] == 2


def died(rank):
    return WorkerFailedError("Worker(s) failed", [RankFailure(rank, RuntimeError("gone"), died=True)])


def test_a_worker_failure_restarts_the_group_and_restores_the_commit():
    trainer, first = make(config={BATCH_SIZE: 64})
    ok = [{"epoch": 1, "num_samples": 32, "loss": 1.0}] * 2
    FakeWorkerGroup.train_script[:] = [died(1), ok]
    result = trainer.train()
    second = FakeWorkerGroup.instances[-1]
    assert first.shut and second is not first and second.num_workers == 2
    assert second.calls[0][0] == "restore"
    assert second.calls[1] == ("train_epoch", (None, False, None, False))
    assert result["num_samples"] == 64
    stats = trainer.recovery_stats
    assert (stats.failures, stats.recoveries, stats.num_workers) == (1, 1, 2)


def test_spares_take_a_dead_rank_in_place_and_the_group_stays(monkeypatch):
    trainer, first = make(config={BATCH_SIZE: 64})
    monkeypatch.setattr(first, "can_replace", lambda ranks: list(ranks) == [1], raising=False)
    monkeypatch.setattr(first, "replace",
                        lambda ranks, avoid=(): first.calls.append(("replace", ranks))
                        or [dict(first.capabilities)] * 2, raising=False)
    ok = [{"epoch": 1, "num_samples": 32, "loss": 1.0}] * 2
    FakeWorkerGroup.train_script[:] = [died(1), ok]
    trainer.train()
    assert FakeWorkerGroup.instances[-1] is first and not first.shut
    assert [call[0] for call in first.calls[-3:]] == ["replace", "restore", "train_epoch"]
    assert first.calls[-1][1][-1] is False  # a whole pass again: the commit's step is 0
    stats = trainer.recovery_stats
    assert (stats.failures, stats.recoveries, stats.num_workers) == (1, 1, 2)


def test_the_survivors_newer_state_becomes_the_commit_that_every_rank_restores(monkeypatch):
    from types import SimpleNamespace

    from raysgd.state.commit import Commit

    trainer, first = make(config={BATCH_SIZE: 64})
    fresh = Commit(7, 7, 2, ["from rank 0", "newcomer"])
    monkeypatch.setattr(first, "can_replace", lambda ranks: list(ranks) == [1], raising=False)
    monkeypatch.setattr(first, "replace", lambda ranks, avoid=(): [dict(first.capabilities)] * 2,
                        raising=False)
    monkeypatch.setattr(first, "survivor_commit", lambda dead, commit: fresh, raising=False)
    reports = {0: {"steps": 8}, 1: {"steps": 8}}  # the batch of step 8 was in flight
    monkeypatch.setattr(first, "watch", lambda *a, **k: SimpleNamespace(
        monitor=SimpleNamespace(reports=reports), ticket=1), raising=False)
    FakeWorkerGroup.train_script[:] = [died(1), [{"epoch": 1, "num_samples": 32, "loss": 1.0}] * 2]
    trainer.train()
    restores = [call[1][0] for call in first.calls if call[0] == "restore"]
    assert restores == [fresh]
    assert first.calls[-1] == ("train_epoch", (None, False, None, True))  # resumed mid-call
    assert trainer.recovery_stats.steps_lost == 1  # counted from the survivors' step 7


def test_a_failed_replacement_falls_back_to_a_new_group_in_the_same_attempt(monkeypatch):
    trainer, first = make(config={BATCH_SIZE: 64})

    def broken_replace(ranks, avoid=()):
        raise RuntimeError("the spare's operator setup raised")

    monkeypatch.setattr(first, "can_replace", lambda ranks: True, raising=False)
    monkeypatch.setattr(first, "replace", broken_replace, raising=False)
    FakeWorkerGroup.train_script[:] = [died(1), [{"epoch": 1, "num_samples": 32, "loss": 1.0}] * 2]
    trainer.train()
    second = FakeWorkerGroup.instances[-1]
    assert first.shut and second is not first and second.calls[0][0] == "restore"
    assert trainer.recovery_stats.recoveries == 1  # one attempt, although two ways were tried


def test_too_few_resources_after_a_failure_resizes_and_keeps_the_global_batch():
    trainer, first = make(config={BATCH_SIZE: 64}, failure_config=None)
    FakeWorkerGroup.placeable_script[:] = [1]  # only one worker fits after the failure
    FakeWorkerGroup.train_script[:] = [died(0), [{"epoch": 1, "num_samples": 64, "loss": 1.0}]]
    trainer.train()
    second = FakeWorkerGroup.instances[-1]
    assert second.num_workers == 1 and second.config_for_rank(0)[BATCH_SIZE] == 64
    assert trainer.recovery_stats.resizes == [(2, 1, "resize to 1 of 2 worker(s): only 1 placeable")]


@pytest.mark.parametrize("kwargs", [{"scheduler_step_freq": "often"}, {"backend": "mpi"},
                                    {"use_fp16": "half"}])
def test_enumerated_arguments_are_checked_before_ray_starts(kwargs, monkeypatch):
    def ray_would_start():
        raise AssertionError("the GPU probe (and ray.init) ran before validation")

    monkeypatch.setattr(FakeWorkerGroup, "cluster_gpus", staticmethod(ray_would_start))
    with pytest.raises(ConfigError):
        TorchTrainer(LinearOperator, num_workers=2, _worker_group_cls=FakeWorkerGroup, **kwargs)


def test_num_gpus_per_worker_shapes_the_bundle_and_is_checked_against_the_cluster(monkeypatch):
    from raysgd.driver.worker_group import WorkerGroup

    monkeypatch.setattr(FakeWorkerGroup, "cluster_gpus", staticmethod(lambda: 4.0))
    trainer = TorchTrainer(LinearOperator, num_workers=2, use_gpu=True, num_gpus_per_worker=2,
                           _worker_group_cls=FakeWorkerGroup)
    settings = FakeWorkerGroup.instances[-1].settings
    assert settings.num_gpus_per_worker == 2
    group = WorkerGroup(LinearOperator, lambda rank: {}, settings, 2)  # reserves nothing yet
    assert group._bundle() == {"CPU": 1.0, "GPU": 2.0}
    trainer.shutdown()
    with pytest.raises(ConfigError, match=r"needs 3 GPU\(s\) per worker \(2 workers\), but the "
                                          r"cluster has 4"):
        TorchTrainer(LinearOperator, num_workers=2, use_gpu=True, num_gpus_per_worker=3,
                     _worker_group_cls=FakeWorkerGroup)
    with pytest.raises(ConfigError, match="num_gpus_per_worker must be a positive number"):
        TorchTrainer(LinearOperator, num_workers=2, use_gpu=True, num_gpus_per_worker="two",
                     _worker_group_cls=FakeWorkerGroup)


def test_num_workers_per_host_reserves_one_bundle_per_host():
    from raysgd.config import WorkerSettings
    from raysgd.driver.worker_group import WorkerGroup

    group = WorkerGroup(LinearOperator, lambda rank: {}, WorkerSettings(), 5, workers_per_host=2)
    assert group._bundles() == [{"CPU": 2.0}] * 3  # the last host holds one worker
    trainer = TorchTrainer(LinearOperator, num_workers=4, num_workers_per_host=2,
                           _worker_group_cls=FakeWorkerGroup)
    assert trainer._placement_strategy == "STRICT_SPREAD"
    trainer.shutdown()
    with pytest.raises(ConfigError, match="contradicts"):
        TorchTrainer(LinearOperator, num_workers=4, num_workers_per_host=2,
                     placement_strategy="SPREAD", _worker_group_cls=FakeWorkerGroup)
