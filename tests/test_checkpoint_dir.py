"""Checkpoint directories and the background disk writer; no Ray."""
import json
import logging
import multiprocessing
import os
import threading

import pytest
import torch

from raysgd.driver.run_recorder import DiskSettings, log_record
from raysgd.errors import CheckpointError, ConfigError
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.checkpoint_dir import BEST, INDEX, CheckpointDirectory
from raysgd.state.commit import Commit
from raysgd.state.commit_files import CommitFiles, to_checkpoint, to_snapshots
from raysgd.state.disk_checkpoints import DiskCheckpointer, ScoreRule, check_compatible
from raysgd.state.disk_schedule import DiskSchedule
from raysgd.state.packing import pack_tensors


def _bytes(value: float) -> bytes:
    return checkpoint_io.to_bytes({"models": [{"w": torch.tensor([value])}], "optimizers": [{}]})


def _weight(path: str) -> float:
    return checkpoint_io.load(path)["models"][0]["w"].item()


def test_retention_keeps_newest_and_index_names_latest(tmp_path):
    directory = CheckpointDirectory(str(tmp_path), keep=3)
    paths = [directory.write(_bytes(i), {"step": i}) for i in range(5)]
    on_disk = sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint-"))
    assert on_disk == [os.path.basename(p) for p in paths[-3:]]
    index = json.loads((tmp_path / INDEX).read_text())
    assert index["latest"] == os.path.basename(paths[-1])
    assert [e["step"] for e in index["checkpoints"]] == [2, 3, 4]
    state, entry = directory.load_latest()
    assert entry["step"] == 4 and state["models"][0]["w"].item() == 4


def test_keep_none_keeps_every_checkpoint(tmp_path):
    directory = CheckpointDirectory(str(tmp_path), keep=None)
    for i in range(4):
        directory.write(_bytes(i), {"step": i})
    assert len(directory.entries()) == 4


def _write_many(path: str, worker: int, count: int) -> None:
    directory = CheckpointDirectory(path, keep=3)
    for i in range(count):
        directory.write(_bytes(worker * 1000 + i), {"step": worker * 1000 + i})


def _check_consistent(path: str, keep: int, total: int) -> None:
    index = json.loads(open(os.path.join(path, INDEX)).read())
    names = [e["file"] for e in index["checkpoints"]]
    assert len(names) == keep and index["latest"] == names[-1]
    assert sorted(p for p in os.listdir(path) if p.startswith("checkpoint-")) == sorted(names)
    seqs = [e["seq"] for e in index["checkpoints"]]
    assert seqs == sorted(seqs) and seqs[-1] == total  # no write lost a sequence number
    for name in names:
        _weight(os.path.join(path, name))  # every listed file is complete


def test_concurrent_writers_in_threads_keep_a_consistent_index(tmp_path):
    threads = [threading.Thread(target=_write_many, args=(str(tmp_path), w, 15)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    _check_consistent(str(tmp_path), keep=3, total=60)


def test_concurrent_writers_in_processes_keep_a_consistent_index(tmp_path):
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_write_many, args=(str(tmp_path), w, 10)) for w in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    _check_consistent(str(tmp_path), keep=3, total=30)


def test_truncated_latest_falls_back_to_previous_with_a_warning(tmp_path, caplog):
    directory = CheckpointDirectory(str(tmp_path), keep=3)
    for i in range(3):
        latest = directory.write(_bytes(i), {"step": i})
    data = open(latest, "rb").read()
    open(latest, "wb").write(data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        state, entry = directory.load_latest()
    assert entry["step"] == 1 and state["models"][0]["w"].item() == 1
    assert any("unreadable" in r.message and os.path.basename(latest) in r.message
               for r in caplog.records)


def test_every_checkpoint_unreadable_raises_and_says_how_to_start_over(tmp_path):
    directory = CheckpointDirectory(str(tmp_path), keep=2)
    for i in range(2):
        path = directory.write(_bytes(i), {"step": i})
        open(path, "wb").write(b"garbage")
    with pytest.raises(CheckpointError, match="resume=False"):
        directory.load_latest()


def test_lost_index_is_rebuilt_from_the_files(tmp_path, caplog):
    directory = CheckpointDirectory(str(tmp_path), keep=3)
    for i in range(3):
        directory.write(_bytes(i), {"step": i})
    (tmp_path / INDEX).write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        state, entry = directory.load_latest()
    assert state["models"][0]["w"].item() == 2
    assert "rebuilt" in caplog.text
    directory.write(_bytes(9), {"step": 9})  # numbering continues after the files found
    assert directory.entries()[-1]["seq"] == 4


def test_empty_directory_has_nothing_to_resume(tmp_path):
    assert CheckpointDirectory(str(tmp_path / "new")).load_latest() is None


def test_stale_temp_files_of_a_crashed_write_are_removed(tmp_path):
    stale = tmp_path / ".tmp-abc.raysgd"
    stale.write_bytes(b"half")
    os.utime(stale, (0, 0))
    CheckpointDirectory(str(tmp_path)).write(_bytes(1), {"step": 1})
    assert not stale.exists()


# ------------------------------------------------------------ disk writer
def _snapshot(rank: int, weight: float, step: int) -> dict:
    state = {"global_step": step, "epoch": 1, "batch_idx": step, "steps": step,
             "pass_done": False, "rng": {"torch": torch.get_rng_state()}}
    if rank == 0:
        state.update(models=[{"w": torch.tensor([weight])}], optimizers=[{}])
    return {"step": step, "call_done": 0, "world_size": 2, "state": pack_tensors(state),
            "meters": None}


def _commit(step: int, weight: float = 0.0) -> Commit:
    return Commit(step, 0, 2, [_snapshot(0, weight, step), _snapshot(1, weight, step)])


def _writer(tmp_path, **kwargs) -> DiskCheckpointer:
    return DiskCheckpointer(CheckpointDirectory(str(tmp_path), keep=kwargs.pop("keep", 10)),
                            CommitFiles(lambda snaps: list(snaps)), operator="m.Op", **kwargs)


def test_writer_writes_call_ends_and_every_n_steps_inside_a_call(tmp_path):
    # In-epoch commits come every checkpoint_every_n_steps (2 here) of the global step.
    writer = _writer(tmp_path, every_n_steps=4)
    assert writer.schedule == DiskSchedule(4)  # the rule the ranks stage by under FSDP
    for step in (2, 4, 6, 8, 10):
        writer.commit_moved(_commit(step), in_epoch=True)
        writer.flush()
    writer.commit_moved(_commit(11), in_epoch=False)  # a call's end, wherever it falls
    writer.flush()
    writer.commit_moved(_commit(12), in_epoch=True)
    writer.flush()
    writer.commit_moved(_commit(14), in_epoch=True)  # not a multiple: not written
    writer.commit_moved(_commit(2), in_epoch=False)  # load() of an older state
    writer.flush()
    writer.commit_moved(_commit(4), in_epoch=True)  # replaces the old step 4
    writer.close()
    assert [e["step"] for e in writer.directory.entries()] == [8, 11, 12, 2, 4]
    # Each file was staged beside its place and linked in: no staged file is left over.
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp-")]


def test_a_checkpoint_of_a_listed_step_replaces_it(tmp_path):
    directory = CheckpointDirectory(str(tmp_path), keep=2)
    directory.write(_bytes(1), {"step": 5})
    directory.write(_bytes(2), {"step": 8})
    latest = directory.write(_bytes(3), {"step": 8})  # update_scheduler after train()
    assert [e["step"] for e in directory.entries()] == [5, 8]
    assert _weight(latest) == 3 and len([p for p in os.listdir(tmp_path)
                                         if p.startswith("checkpoint-")]) == 2


def test_writer_without_every_n_writes_only_call_ends(tmp_path):
    writer = _writer(tmp_path)
    writer.commit_moved(_commit(4), in_epoch=True)
    writer.commit_moved(_commit(5), in_epoch=False)
    writer.close()
    assert [e["step"] for e in writer.directory.entries()] == [5]


def test_checkpoint_file_loads_with_load_and_round_trips_every_rank(tmp_path):
    writer = _writer(tmp_path)
    writer.commit_moved(_commit(7, weight=3.0), in_epoch=False)
    writer.close()
    path = writer.last_path
    state = checkpoint_io.load(path)  # what trainer.load(path) reads
    assert state["models"][0]["w"].item() == 3.0
    meta, snapshots = to_snapshots(state)
    assert meta["operator"] == "m.Op" and meta["step"] == 7 and meta["epoch"] == 0
    assert len(snapshots) == 2 and snapshots[1]["step"] == 7


def test_to_checkpoint_keeps_rank_parts_in_order():
    state = to_checkpoint([_snapshot(0, 1.0, 3), _snapshot(1, 1.0, 5)], {"step": 3})
    assert state["ranks"][0]["steps"] == 5 and "models" not in state["ranks"][0]


def test_newer_pending_commit_replaces_an_unwritten_one(tmp_path):
    gate = threading.Event()

    def slow_fetch(snaps):
        gate.wait(10)
        return list(snaps)

    writer = DiskCheckpointer(CheckpointDirectory(str(tmp_path)), CommitFiles(slow_fetch), "m.Op")
    for step in (1, 2, 3, 4):
        writer.commit_moved(_commit(step), in_epoch=False)
    gate.set()
    writer.close()
    steps = [e["step"] for e in writer.directory.entries()]
    assert steps[-1] == 4 and len(steps) <= 2  # 1 may have started; 2 and 3 were superseded


def test_a_write_the_storage_failed_is_reported_and_retried(tmp_path, caplog):
    directory = CheckpointDirectory(str(tmp_path))
    real_write, calls = directory.store.write, []

    def flaky_write(rel, data):
        calls.append(rel)
        if len(calls) == 1:
            raise OSError("disk full")
        return real_write(rel, data)

    directory.store.write = flaky_write
    writer = DiskCheckpointer(directory, CommitFiles(lambda snaps: list(snaps)), "m.Op")
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        writer.commit_moved(_commit(1), in_epoch=False)
        writer.flush()
        writer.commit_moved(_commit(2), in_epoch=False)
        writer.close()
    assert "disk full" in caplog.text and "retrying with backoff" in caplog.text
    assert [e["step"] for e in writer.directory.entries()] == [1, 2]  # the retry landed
    assert writer.never_written == []


def test_a_commit_that_cannot_be_fetched_is_skipped_not_retried(tmp_path, caplog):
    def lost(snaps):
        raise TimeoutError("object lost")  # Ray's GetTimeoutError is an OSError too

    writer = DiskCheckpointer(CheckpointDirectory(str(tmp_path)), CommitFiles(lost), "m.Op")
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        writer.commit_moved(_commit(1), in_epoch=False)
        assert writer.flush(10)
    assert "could not be fetched" in caplog.text and "retrying" not in caplog.text
    assert writer.close() == [] and writer.directory.entries() == []


def test_best_checkpoint_follows_the_score(tmp_path):
    writer = _writer(tmp_path, score=ScoreRule.create("val_loss"))
    for step, loss in ((1, 0.5), (2, 0.7), (3, 0.2), (4, float("nan"))):
        commit = _commit(step, weight=float(step))
        writer.commit_moved(commit, in_epoch=False)
        writer.result("validate", {"val_loss": loss}, commit)
        writer.flush()
    writer.close()
    best = writer.directory.best()
    assert best["score"] == 0.2 and best["step"] == 3 and best["mode"] == "min"
    assert _weight(str(tmp_path / BEST)) == 3.0
    resumed = _writer(tmp_path, score=ScoreRule.create("val_loss"), resumed_step=4)
    assert resumed.best_score == 0.2  # a resumed run keeps the bar
    resumed.close()
    fresh = _writer(tmp_path, score=ScoreRule.create("val_loss"))
    assert fresh.best_score is None  # resume=False: the old run's best is no bar
    fresh.close()
    earlier = _writer(tmp_path, score=ScoreRule.create("val_loss"), resumed_step=2)
    assert earlier.best_score is None  # scored on a timeline the resume abandoned
    earlier.close()


def test_a_score_attr_missing_from_validate_is_reported_once(tmp_path, caplog):
    writer = _writer(tmp_path, score=ScoreRule.create("val_los"))
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        writer.result("train", {"train_loss": 1.0}, _commit(1))
        for _ in range(2):
            writer.result("validate", {"val_loss": 1.0}, _commit(1))
    writer.close()
    assert len([r for r in caplog.records if "checkpoint_score_attr='val_los'" in r.message]) == 1
    assert writer.directory.best() is None


def test_score_rule_modes():
    assert ScoreRule.create("val_loss").mode == "min"
    assert ScoreRule.create("val_accuracy").mode == "max"
    assert ScoreRule.create("val_accuracy", "min").better(0.1, 0.2)
    assert ScoreRule.create("val_mse").mode == "min"
    assert ScoreRule.create("min-val_acc") == ScoreRule("val_acc", "min")  # Tune's legacy form
    assert ScoreRule.create("max-val_loss") == ScoreRule("val_loss", "max")
    with pytest.raises(ConfigError, match="give one of them"):
        ScoreRule.create("max-val_loss", "min")
    with pytest.raises(ConfigError, match="checkpoint_score_mode"):
        ScoreRule.create("val_loss", "lowest")
    with pytest.raises(ConfigError, match="metric name"):
        ScoreRule.create(3)


def test_checkpoint_of_another_operator_is_refused_naming_both():
    with pytest.raises(CheckpointError, match=r"written by a\.Old.*runs b\.New"):
        check_compatible({"operator": "a.Old"}, "b.New", "/x/checkpoint-000001.pt")


# --------------------------------------------------------- trainer arguments
def test_disk_settings_refuse_bad_input(tmp_path):
    def create(**kw):
        args = dict(checkpoint_dir=str(tmp_path), keep_checkpoints=3, every_n_steps=None,
                    resume=True, score_attr=None, score_mode="auto", commit_every=50)
        args.update(kw)
        return DiskSettings.create(**args)

    assert create().store.uri == str(tmp_path)
    with pytest.raises(ConfigError, match="needs a directory"):
        create(checkpoint_dir=None, every_n_steps=50)
    with pytest.raises(ConfigError, match="needs a directory"):
        create(checkpoint_dir=None, score_attr="val_loss")
    with pytest.raises(ConfigError, match="multiple of checkpoint_every_n_steps=50"):
        create(every_n_steps=60)
    with pytest.raises(ConfigError, match="checkpoint_every_n_steps=None turned them off"):
        create(every_n_steps=10, commit_every=None)
    with pytest.raises(ConfigError, match="use_local=False"):
        create(every_n_steps=50, in_process=True)
    with pytest.raises(ConfigError, match="keep_checkpoints"):
        create(keep_checkpoints=0)
    with pytest.raises(ConfigError, match="resume"):
        create(resume="yes")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="cannot be created"):
        create(checkpoint_dir=str(blocker / "sub"))
    with pytest.raises(ConfigError, match="scheme 'ftp'.*s3://"):
        create(checkpoint_dir="ftp://host/run")
    with pytest.raises(ConfigError, match="storage_filesystem must be a pyarrow.fs.FileSystem"):
        create(filesystem=object())
    with pytest.raises(ConfigError, match="storage_filesystem needs a directory"):
        create(checkpoint_dir=None, filesystem=object())


def test_log_record_prefixes_by_phase_and_adds_throughput():
    train = log_record("train", {"epoch": 3, "train_loss": 0.5, "num_samples": 100,
                                 "batch_count": 4, "last_train_loss": 0.4, "tag": "x"}, 2, 0.5)
    assert train == {"epoch": 2, "train_loss": 0.5, "train_num_samples": 100,
                     "train_batch_count": 4, "train_samples_per_s": 200.0}
    val = log_record("validate", {"val_loss": 0.3, "accuracy": 0.9, "num_samples": 10}, 2, 0.0)
    assert val == {"epoch": 2, "val_loss": 0.3, "val_accuracy": 0.9, "val_num_samples": 10}
