"""Function trainables (DistributedTrainableCreator) on a real Ray with real gloo groups."""
import os
import signal

import pytest
import torch
import torch.distributed as dist

from raysgd.errors import ConfigError
from raysgd.function.session import distributed_checkpoint_dir, is_distributed_trainable

pytestmark = pytest.mark.timeout(300)


def ranked_epochs(config, checkpoint_dir=None):
    """Reports rank 0's and rank 1's numbers apart, resumes from its checkpoint's epoch."""
    from ray import tune

    start = 0
    if checkpoint_dir:
        with open(os.path.join(checkpoint_dir, "epoch")) as handle:
            start = int(handle.read()) + 1
    total = torch.ones(1)
    dist.all_reduce(total)  # a real collective: the group spans the workers
    for epoch in range(start, config.get("epochs", 4)):
        with distributed_checkpoint_dir(step=epoch) as path:
            with open(os.path.join(path, "epoch"), "w") as handle:
                handle.write(str(epoch))
        tune.report({"epoch": epoch, "rank": dist.get_rank(), "world": int(total.item()),
                     "distributed": is_distributed_trainable(), "resumed_from": start,
                     "checkpoint_dir": checkpoint_dir,
                     "worker_pid": os.getpid()})


def train_api(config):
    """Ray Train 2's names: get_checkpoint, report(checkpoint=...), get_context."""
    import tempfile

    import ray.train as train

    checkpoint = train.get_checkpoint()
    seen = None
    if checkpoint is not None:
        with open(os.path.join(checkpoint.path, "value")) as handle:
            seen = handle.read()
    path = tempfile.mkdtemp()
    with open(os.path.join(path, "value"), "w") as handle:
        handle.write(f"from rank {dist.get_rank()}")
    train.report({"seen": seen, "world_rank": train.get_context().get_world_rank()},
                 checkpoint=train.Checkpoint.from_directory(path))


def dies_while_rank_0_waits(config, checkpoint_dir=None):
    """First run only: rank 1 dies at epoch 1 while rank 0 waits far longer than the test
    allows, as a survivor waits inside an NCCL collective whose peer is gone."""
    import time

    from ray import tune

    start = 1 if checkpoint_dir else 0
    first_run = not os.path.exists(config["flag"])
    for epoch in range(start, 3):
        if epoch == 1 and first_run:
            if dist.get_rank() == 1:
                open(config["flag"], "w").close()
                os._exit(1)
            time.sleep(600)
        with distributed_checkpoint_dir(step=epoch) as path:
            open(os.path.join(path, "marker"), "w").close()
        tune.report({"epoch": epoch, "resumed": bool(checkpoint_dir)})


def fails_on_rank_1(config):
    from ray import tune

    if dist.get_rank() == 1:
        raise ValueError("rank 1 cannot go on")
    tune.report({"ok": 1})


def make(func, **kwargs):
    from raysgd.torch import DistributedTrainableCreator

    kwargs.setdefault("num_workers", 2)
    return DistributedTrainableCreator(func, **kwargs)


def test_reports_rank_0_metrics_and_ends_like_legacy(ray_cpus):
    trainable = make(ranked_epochs)(config={"epochs": 2})
    try:
        first = trainable.train()
        assert (first["epoch"], first["rank"], first["world"]) == (0, 0, 2)
        assert first["distributed"] and first["should_checkpoint"]
        assert trainable.train()["epoch"] == 1
        assert trainable.train()["done"]  # the function returned: the last result again
        with pytest.raises(RuntimeError, match="already finished"):
            trainable.train()
    finally:
        trainable.stop()


def test_save_then_restore_into_a_new_trainable(ray_cpus):
    cls = make(ranked_epochs)
    first = cls(config={"epochs": 5})
    try:
        first.train()
        first.train()
        saved = first.save()
        with open(os.path.join(saved, "epoch")) as handle:
            assert handle.read() == "1"
    finally:
        first.stop()
    second = cls(config={"epochs": 5})
    try:
        second.restore(saved)
        result = second.train()
        assert (result["epoch"], result["resumed_from"]) == (2, 2)
    finally:
        second.stop()
    assert not os.path.exists(result["checkpoint_dir"])  # the workers' copy goes with them


def test_restore_into_a_running_trainable_restarts_from_the_checkpoint(ray_cpus):
    trainable = make(ranked_epochs)(config={"epochs": 6})
    try:
        trainable.train()
        saved = trainable.save()  # after epoch 0
        trainable.train()
        old_pid = trainable.train()["worker_pid"]  # epoch 2
        trainable.restore(saved)  # what PBT's exploit does to a running trial
        result = trainable.train()
        assert (result["epoch"], result["resumed_from"]) == (1, 1)
        assert result["worker_pid"] != old_pid  # fresh workers: a running function cannot be rewound
    finally:
        trainable.stop()


def test_ray_train_report_get_checkpoint_and_context(ray_cpus, tmp_path):
    trainable = make(train_api)()
    try:
        result = trainable.train()
        assert result["seen"] is None and result["world_rank"] == 0
        saved = trainable.save()
    finally:
        trainable.stop()
    restored = make(train_api)()
    try:
        restored.restore(saved)
        assert restored.train()["seen"] == "from rank 0"  # rank 0's checkpoint was kept
    finally:
        restored.stop()


def test_user_error_names_the_function_error(ray_cpus):
    trainable = make(fails_on_rank_1)()
    try:
        with pytest.raises(Exception, match="rank 1 cannot go on"):
            trainable.train()
    finally:
        trainable.stop()


def test_one_worker_still_gets_a_process_group(ray_cpus):
    trainable = make(ranked_epochs, num_workers=1)(config={"epochs": 1})
    try:
        assert trainable.train()["world"] == 1
    finally:
        trainable.stop()


@pytest.mark.parametrize("kwargs, message", [
    ({"num_gpus_per_worker": -1}, "num_gpus_per_worker must be a positive number"),
    ({"num_workers_per_host": 0}, "num_workers_per_host must be an integer >= 1"),
    ({"backend": "nccl"}, "needs GPUs"),
    ({"num_workers": 0}, "num_workers"),
])
def test_bad_arguments_fail_before_any_worker(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make(ranked_epochs, **kwargs)


def test_resources_per_trial_follow_the_creator_arguments():
    def bundles(**kwargs):
        return make(ranked_epochs, **kwargs).default_resource_request({}).bundles

    assert bundles()[-2:] == [{"CPU": 1.0}] * 2
    assert bundles(num_gpus_per_worker=2, num_cpus_per_worker=2)[-2:] == [{"CPU": 2.0, "GPU": 2.0}] * 2
    assert bundles(use_gpu=True)[-2:] == [{"CPU": 1.0, "GPU": 1.0}] * 2  # Ray 0.8's flag
    assert make(ranked_epochs, num_workers_per_host=1)._placement_strategy == "STRICT_SPREAD"
    # Two workers per host: one bundle holding both, on distinct hosts.
    assert bundles(num_workers=4, num_workers_per_host=2)[-2:] == [{"CPU": 2.0}] * 2


def test_bad_signature_is_a_value_error():
    def three(a, b, c):
        return a

    with pytest.raises(ValueError, match=r"func\(config\)"):
        make(three)


@pytest.mark.slow
def test_tuner_two_workers_reports_checkpoints_and_restores(ray_cpus, tmp_path):
    from ray import tune

    tuner = tune.Tuner(make(ranked_epochs), param_space={"epochs": 3},
                       tune_config=tune.TuneConfig(num_samples=2),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), name="func",
                                                 verbose=0))
    results = tuner.fit()
    assert not results.errors
    for result in results:
        assert result.metrics["epoch"] == 2 and result.metrics["world"] == 2
        with open(os.path.join(result.checkpoint.path, "epoch")) as handle:
            assert handle.read() == "2"
    # A trial restored from its checkpoint starts the function from it.
    trainable = make(ranked_epochs)(config={"epochs": 4})
    try:
        trainable.restore(results[0].checkpoint.path)
        assert trainable.train()["resumed_from"] == 3
    finally:
        trainable.stop()


@pytest.mark.slow
def test_the_workers_tune_context_names_the_trial(ray_cpus, tmp_path):
    """Ray 1.12's _train_validate_session: every worker's session knows its trial."""
    from ray import tune

    from raysgd.torch.func_trainable import _train_validate_session

    tuner = tune.Tuner(make(_train_validate_session, num_workers=2),
                       run_config=tune.RunConfig(storage_path=str(tmp_path), name="session",
                                                 stop={"training_iteration": 1}, verbose=0))
    results = tuner.fit()
    assert not results.errors
    assert results[0].metrics["seen_trial_id"] == results[0].metrics["trial_id"]  # Tune's own


@pytest.mark.slow
def test_killed_worker_restarts_the_function_from_the_last_checkpoint(ray_cpus):
    trainable = make(ranked_epochs)(config={"epochs": 6})
    try:
        assert trainable.train()["epoch"] == 0
        assert trainable.train()["epoch"] == 1
        pids = trainable._trainer.apply_all_workers(os.getpid)
        os.kill(pids[1], signal.SIGKILL)  # rank 1 dies between two reports
        result = trainable.train()
        # Fresh workers ran the function again from the checkpoint of epoch 1.
        assert (result["epoch"], result["resumed_from"]) == (2, 2)
        assert result["worker_pid"] != pids[0]
        assert trainable._trainer.recovery_stats.failures == 1
    finally:
        trainable.stop()


@pytest.mark.slow
def test_a_survivor_stuck_in_the_function_does_not_hang_the_trial(ray_cpus, tmp_path):
    import time

    trainable = make(dies_while_rank_0_waits)(config={"flag": str(tmp_path / "died")})
    try:
        assert trainable.train()["epoch"] == 0
        started = time.monotonic()
        result = trainable.train()  # rank 1 dies; rank 0 would sleep for 10 minutes
        assert time.monotonic() - started < 60
        assert (result["epoch"], result["resumed"]) == (1, True)
        assert trainable._trainer.recovery_stats.failures == 1
    finally:
        trainable.stop()
