"""Ray Data input on a real Ray with 2 workers and real gloo process groups.

Datasets of ids: every test counts which rows each rank saw in each pass.
"""
import collections
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from ray_data_operators import IdOperator
from raysgd import ConfigError, DatasetConfig, TorchTrainer
from raysgd.data import Dataset as LegacyDataset
from raysgd.utils import BATCH_SIZE

pytestmark = pytest.mark.timeout(300)

IDS = DatasetConfig(feature_columns=["x"], label_column="id")


@pytest.fixture(scope="module")
def data(ray_session):
    import ray.data

    ray.data.DataContext.get_current().enable_progress_bars = False

    def make(n, blocks=None):
        return ray.data.from_items([{"x": float(i), "id": i} for i in range(n)],
                                   override_num_blocks=blocks)
    return make


def seen(trainer, attr="seen"):
    """Ids each rank saw since the last call of this, per rank; clears them."""
    def take(op):
        ids = list(getattr(op, attr))
        getattr(op, attr).clear()
        return ids
    return trainer.apply_all_operators(take)


def assert_once(per_rank, n):
    every = [i for ids in per_rank for i in ids]
    duplicated = [i for i, c in collections.Counter(every).items() if c > 1]
    assert not duplicated, duplicated[:10]
    assert sorted(every) == list(range(n))


def test_every_row_once_per_pass_and_batch_size_split(trainer_factory, data):
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 20},
                              datasets={"train": data(200, blocks=7)}, dataset_config=IDS)
    for epoch in (1, 2):
        assert trainer.train()["epoch"] == epoch
        per_rank = seen(trainer)
        assert_once(per_rank, 200)
        assert [len(ids) for ids in per_rank] == [100, 100]  # equal shards: same step count
    sizes = trainer.apply_all_operators(lambda op: set(op.batch_sizes))
    assert sizes == [{10}, {10}]  # the global BATCH_SIZE 20, split over 2 workers
    assert trainer.epoch == 2


def test_uneven_rows_and_blocks_train_at_most_once_and_validate_exactly_once(
        trainer_factory, data):
    # 101 rows in blocks of uneven size: an equal training split leaves one row out of
    # the pass; validation (not split equally) sees every row.
    ds = data(101, blocks=6)
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 16},
                              datasets={"train": ds, "validation": ds}, dataset_config=IDS)
    trainer.train()
    per_rank = seen(trainer)
    every = [i for ids in per_rank for i in ids]
    assert len(every) == len(set(every)) == 100 and set(every) <= set(range(101))
    assert len(per_rank[0]) == len(per_rank[1])
    for _ in range(2):
        result = trainer.validate()
        assert result["num_samples"] == 101
        assert_once(seen(trainer, "val_seen"), 101)


def test_validate_with_num_steps_or_after_an_error_starts_every_rank_on_a_new_pass(
        trainer_factory, data):
    # 30 rows in 3 blocks: uneven validation shards. A rank that ran out must never wait
    # alone for a new pass (the coordinator starts one only when every rank asks).
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 4, "fail_val_at": 1},
                              datasets={"train": data(30), "validation": data(30, blocks=3)},
                              dataset_config=IDS, timeout_s=30)
    with pytest.raises(RuntimeError, match="validation failed on rank 0"):
        trainer.validate()
    seen(trainer, "val_seen")
    assert trainer.validate(num_steps=3)["batch_count"] <= 6
    per_rank = seen(trainer, "val_seen")
    assert all(len(ids) <= 3 * 2 for ids in per_rank)
    assert trainer.validate()["num_samples"] == 30
    assert_once(seen(trainer, "val_seen"), 30)
    assert trainer.recovery_stats.failures == 0  # nothing hung


def test_a_validation_shard_can_be_empty(trainer_factory, data):
    # One block: one rank streams every validation row, the other none.
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 8}, dataset_config=IDS,
                              datasets={"train": data(16), "validation": data(20, blocks=1)},
                              timeout_s=30)
    for _ in range(2):
        assert trainer.validate()["num_samples"] == 20
        per_rank = seen(trainer, "val_seen")
        assert sorted(len(ids) for ids in per_rank) == [0, 20]
        assert_once(per_rank, 20)
    assert trainer.recovery_stats.failures == 0


def test_num_steps_continues_the_pass_and_wraps_into_the_next(trainer_factory, data):
    # 100 rows, 10 per batch and worker: 5 steps per pass.
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 20},
                              datasets={"train": data(100)}, dataset_config=IDS)
    assert trainer.train(num_steps=3)["epoch"] == 1
    assert trainer.epoch == 0
    assert trainer.train(num_steps=3)["epoch"] == 2  # two steps finish pass 1, one starts pass 2
    assert trainer.epoch == 1
    first_six = seen(trainer)
    assert sum(len(ids) for ids in first_six) == 120
    assert trainer.train()["epoch"] == 2  # finishes pass 2: its 4 remaining steps
    rest = seen(trainer)
    assert sum(len(ids) for ids in rest) == 80
    # Pass 1 = the first 5 steps of each rank; pass 2 = its 6th step and the rest.
    assert_once([ids[:50] for ids in first_six], 100)
    assert_once([a[50:] + b for a, b in zip(first_six, rest)], 100)
    assert trainer.epoch == 2


def test_a_rollback_after_a_call_that_read_nothing_keeps_the_pass(trainer_factory, data):
    import ray

    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 20},
                              datasets={"train": data(100)}, dataset_config=IDS)
    trainer.train(num_steps=2)

    def broken(op):
        raise ValueError("not data")
    with pytest.raises(ValueError, match="not data"):
        trainer.apply_all_operators(broken)
    assert trainer.train()["epoch"] == 1  # the pass goes on, nothing read twice
    assert_once(seen(trainer), 100)
    coordinators = [iterators[0]._coord_actor for iterators
                    in trainer._supervisor.group.shards._split._iterators.values()]
    trainer.shutdown()
    for coordinator in coordinators:  # the driver's split coordinators stop with the group
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(coordinator.get_dataset_context.remote(), timeout=30)


def test_a_load_that_failed_on_one_rank_restarts_every_rank_together(trainer_factory, data):
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 20}, timeout_s=30,
                              datasets={"train": data(100)}, dataset_config=IDS)
    trainer.train(num_steps=2)
    state = trainer.state_dict()
    trainer.train(num_steps=1)
    state["operator"] = {"boom": True}
    # Rank 0 loads the older position (its pass restarts), rank 1 raises before it does.
    with pytest.raises(RuntimeError, match="bad state on rank 1"):
        trainer.load_state_dict(state)
    seen(trainer)
    assert trainer.train()["epoch"] == 1  # every rank reruns pass 1 from its start
    assert_once(seen(trainer), 100)
    assert trainer.recovery_stats.failures == 0  # nobody waited for a pass alone


def test_register_data_with_a_ray_dataset_in_setup(trainer_factory, data):
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 10, "register": data(60)},
                              dataset_config=IDS)
    assert trainer.train()["num_samples"] == 60
    assert_once(seen(trainer), 60)


def test_legacy_train_dataset_call_and_its_batches(trainer_factory, data):
    import torch

    trainer = trainer_factory(IdOperator, datasets={"train": data(40)}, dataset_config=IDS)
    legacy = LegacyDataset(list(range(30)), batch_size=5,
                           download_func=lambda i: (torch.tensor([float(i)]), torch.tensor([i])))
    assert trainer.train(dataset=legacy)["num_samples"] == 30  # replaces the train input
    assert_once(seen(trainer), 30)
    assert trainer.apply_all_operators(lambda op: set(op.batch_sizes)) == [{5}, {5}]
    assert trainer.train(dataset=legacy, num_steps=2)["num_samples"] == 20  # continues it
    with pytest.raises(ConfigError, match=r"train\(dataset=\.\.\.\) takes a ray.data.Dataset; "
                                          r"got a builtins.list"):
        trainer.train(dataset=[1, 2, 3])


def test_a_bad_dataset_is_refused_on_the_driver_before_any_worker_starts(ray_cpus):
    with pytest.raises(ConfigError, match=r"datasets\['train'\] takes a ray.data.Dataset; got "
                                          r"a torch.utils.data.dataloader.DataLoader"):
        from torch.utils.data import DataLoader
        TorchTrainer(IdOperator, num_workers=2, datasets={"train": DataLoader([1, 2])})
    with pytest.raises(ConfigError, match="keys are 'train' and 'validation'"):
        TorchTrainer(IdOperator, num_workers=2, datasets={"val": None})
    with pytest.raises(ConfigError, match="dataset_config must be a raysgd.DatasetConfig"):
        TorchTrainer(IdOperator, num_workers=2, dataset_config={"label_column": "y"})


def test_dict_batches_need_columns_for_the_default_loop(trainer_factory, data):
    trainer = trainer_factory(IdOperator, config={"default_loop": True},
                              datasets={"train": data(40)})
    with pytest.raises(ConfigError, match="got a dict with keys \\['x', 'id'\\].*feature_columns"):
        trainer.train()
    assert trainer.recovery_stats.user_errors == 1
    assert len(trainer.state_dict()["models"]) == 1  # the trainer is still usable


def _kill_when(pid_dir, rank, step):
    def run():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with open(os.path.join(pid_dir, "step")) as handle:
                    if int(handle.read()) >= step:
                        break
            except (FileNotFoundError, ValueError):
                pass
            time.sleep(0.005)
        with open(os.path.join(pid_dir, f"rank{rank}")) as handle:
            os.kill(int(handle.read()), signal.SIGKILL)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
@pytest.mark.parametrize("spares", [1, 0])
def test_a_worker_killed_mid_pass_restarts_the_pass_on_new_shards(
        trainer_factory, data, tmp_path, caplog, spares):
    # 400 rows, 10 per batch and worker: 20 steps per pass, a commit every 5.
    trainer = trainer_factory(IdOperator, config={BATCH_SIZE: 20, "pid_dir": str(tmp_path),
                                                  "sleep_s": 0.03},
                              datasets={"train": data(400, blocks=8)}, dataset_config=IDS,
                              checkpoint_every_n_steps=5, spare_workers=spares)
    trainer.train(num_steps=2)  # the spare starts at the first commit
    seen(trainer)
    killer = _kill_when(tmp_path, 1, 2 + 12)
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        result = trainer.train()  # finishes pass 1, which the kill interrupts
    killer.join()
    stats = trainer.recovery_stats
    assert stats.failures == 1 and stats.recoveries == 1
    restarts = [r.getMessage() for r in caplog.records if "restarts from its first batch" in r.getMessage()]
    assert len(restarts) == 1 and "pass 1 restarts" in restarts[0], restarts
    # Every rank set up again after the kill: what they saw since is the restarted pass,
    # every row exactly once; the call's metrics count from the restart.
    assert_once(seen(trainer), 400)
    assert result["epoch"] == 1 and result["num_samples"] == 400
    assert trainer.train()["epoch"] == 2
    assert_once(seen(trainer), 400)


@pytest.mark.slow
def test_shards_stream_to_workers_on_two_raylets():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_ray_data.py")
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines == ["RESULT ok"], out.stdout[-2000:]
