"""Sharded disk checkpoints without Ray: the ranks' staging, the directory format, and the
run directory holding such directories (issue 24). Fake DCP files stand in for torch's:
the real ones are written and read in test_fsdp.py."""
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch

from raysgd.driver.staged import staged_parts
from raysgd.errors import CheckpointError, StagedCheckpointSuperseded
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.checkpoint_dir import INDEX, RANKS_KEY, RUN_KEY, CheckpointDirectory
from raysgd.state.commit import Commit
from raysgd.state.commit_files import to_snapshots
from raysgd.state.disk_checkpoints import DiskCheckpointer, StagedShards
from raysgd.state.disk_schedule import DiskSchedule
from raysgd.state.sharded_dir import RUN_FILE, SHARDED_KEY, read_dir, write_dir
from raysgd.storage.store import LocalStore
from raysgd.worker.staging import KEEP, PREFIX, DiskStaging, NoStaging, create_staging


def test_the_ranks_stage_the_commits_the_driver_writes():
    every_8 = DiskSchedule(every_n_steps=8)
    assert every_8.due(5, call_end=True)  # every call end
    assert [step for step in range(1, 25) if every_8.due(step, call_end=False)] == [8, 16, 24]
    assert not DiskSchedule().due(8, call_end=False)  # only call ends without every_n_steps
    assert isinstance(create_staging(None, 0), NoStaging)


def _fake_dcp(rank):
    """What dcp.save leaves on one rank: its shard file, and rank 0 the metadata."""
    def save(path):
        with open(os.path.join(path, f"__{rank}_0.distcp"), "wb") as handle:
            handle.write(bytes([rank]) * 10)
        if rank == 0:
            with open(os.path.join(path, ".metadata"), "wb") as handle:
                handle.write(b"meta")
        return {"fresh_optimizers": [0]}  # what a load needs besides the files
    return save


def _state(rank, step):
    state = {"global_step": step, "rng": {"torch": torch.arange(3)},
             "shards": {"models": [{"w": 1}], "optimizers": [{}]}}
    return {**state, "schedulers": [{"last_epoch": step}]} if rank == 0 else state


def test_staging_keeps_the_newest_steps_and_serves_their_files():
    staging = DiskStaging(DiskSchedule(every_n_steps=2), rank=1)
    try:
        for step in range(1, 9):
            staging.stage(step, False, _state(1, step), _fake_dcp(1))
        assert sorted(staging._writes) == [4, 6, 8][-KEEP:]
        files = staging.staged_files(8)
        assert sorted(files) == ["__1_0.distcp", "raysgd-rank1.pt"]
        part = checkpoint_io.from_bytes(files["raysgd-rank1.pt"])
        assert part["global_step"] == 8 and "shards" not in part and SHARDED_KEY not in part
        with pytest.raises(CheckpointError, match=r"no staged checkpoint of step 3 .*\[4, 6, 8\]"):
            staging.staged_files(3)
        staging.stage(8, True, _state(1, 99), _fake_dcp(1))  # the same step again: replaced
        assert checkpoint_io.from_bytes(staging.staged_files(8)["raysgd-rank1.pt"])[
            "global_step"] == 99
        assert sorted(staging._writes) == [4, 6, 8]
    finally:
        staging.close()
    assert not os.path.exists(staging.root)


def test_a_held_step_outlives_keep_newer_steps_until_another_is_held():
    """The driver's writer holds the step it writes on every rank first: uploading one
    rank's part to a slow store may take longer than the ranks take to stage KEEP newer
    steps, and the later ranks' parts of the step must still be there (they were rotated
    out, and on S3 under load a checkpoint failed with "no staged checkpoint of step 12")."""
    staging = DiskStaging(DiskSchedule(every_n_steps=2), rank=1)
    try:
        staging.stage(2, False, _state(1, 2), _fake_dcp(1))
        staging.hold(2)
        for step in range(3, 11):
            staging.stage(step, False, _state(1, step), _fake_dcp(1))
        assert sorted(staging._writes) == [2, 6, 8, 10]  # KEEP newest, and the held one
        assert checkpoint_io.from_bytes(staging.staged_files(2)["raysgd-rank1.pt"])[
            "global_step"] == 2
        staging.hold(10)  # the next write: the step before is done with
        staging.stage(12, False, _state(1, 12), _fake_dcp(1))
        assert sorted(staging._writes) == [8, 10, 12]
        assert not os.path.exists(staging._path(2))
        with pytest.raises(CheckpointError, match=r"no staged checkpoint of step 4 .*\[8, 10, 12\]"):
            staging.hold(4)
    finally:
        staging.close()


def test_staging_returns_before_the_shards_are_written_and_serves_them_once_they_are():
    """The training thread only starts the write (DCP's async_save); the driver's fetch, on
    the copies thread, waits for it to finish."""
    from concurrent.futures import Future

    from raysgd.worker.dcp_io import ShardWrite

    finish = threading.Event()
    started = []

    def slow_dcp(path):
        future = Future()

        def write():
            finish.wait(10)
            _fake_dcp(0)(path)
            future.set_result(None)
        thread = threading.Thread(target=write)
        thread.start()
        started.append(thread)
        return ShardWrite({"fresh_optimizers": []}, future)

    staging = DiskStaging(DiskSchedule(), rank=0)
    try:
        staging.stage(4, True, _state(0, 4), slow_dcp)  # returns while the write waits
        fetched = []
        reader = threading.Thread(target=lambda: fetched.append(staging.staged_files(4)))
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not fetched  # waiting for the shards, not failing
        finish.set()
        reader.join(10)
        assert sorted(fetched[0]) == [".metadata", "__0_0.distcp", "raysgd-rank0.pt"]
        part = checkpoint_io.from_bytes(fetched[0]["raysgd-rank0.pt"])
        assert part[SHARDED_KEY]["fresh_optimizers"] == []
    finally:
        finish.set()
        staging.close()
        for thread in started:
            thread.join(10)



def test_a_step_staged_again_while_the_driver_reads_it_is_served_in_its_new_version():
    """A state change between calls (apply_all_operators, update_scheduler) commits the same
    step anew, and its stage may run while the driver's writer fetches the step's first
    version: the fetch waits for the new files instead of failing (it used to fail with "no
    staged checkpoint of step N", and the writer warned that a checkpoint was not written)."""
    restaging, release = threading.Event(), threading.Event()

    def slow_dcp(path):
        restaging.set()
        release.wait(10)
        return _fake_dcp(1)(path)

    staging = DiskStaging(DiskSchedule(), rank=1)
    try:
        staging.stage(8, True, _state(1, 8), _fake_dcp(1))
        stager = threading.Thread(target=staging.stage, args=(8, True, _state(1, 99), slow_dcp))
        stager.start()
        assert restaging.wait(10)
        fetched, errors = [], []

        def read():
            try:
                fetched.append(staging.staged_files(8))
            except Exception as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)
        reader = threading.Thread(target=read)
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and not fetched and not errors  # waiting, not failing
        release.set()
        stager.join(10)
        reader.join(10)
        assert not errors
        assert checkpoint_io.from_bytes(fetched[0]["raysgd-rank1.pt"])["global_step"] == 99
        # Each stage has a version of its own, which the driver checks at the end of a fetch.
        version, files = staging.staged_files(8, with_version=True)
        assert version == staging.staged_version(8) == 2 and "raysgd-rank1.pt" in files
    finally:
        release.set()
        staging.close()


class _Rank:
    """A fake driver-side rank: its files of ``step``, then another version of them."""

    def __init__(self, versions):
        self.versions = list(versions)  # served by the fetch, then by each later check
        self.calls = []

    def staged_files(self, step, by_path, with_version):
        self.calls.append(("files", step))
        return self.versions.pop(0), {f"__0_{step}.distcp": b"x"}

    def staged_version(self, step):
        return self.versions[0]

    def hold_staged(self, step):
        self.calls.append(("hold", step))


class _Group:
    actors, rank_nodes = [], []

    def __init__(self, rank):
        self.local_runner = rank


def test_a_fetch_that_a_new_stage_overtook_is_dropped_not_placed():
    """The ranks' files are fetched one at a time; a step staged anew in between would mix
    two commits' files, so every rank is asked again at the end."""
    parts = staged_parts(_Group(_Rank([3, 3])), 8)
    assert list(parts) == [{"__0_8.distcp": b"x"}]  # the version stood: the fetch stands
    parts = staged_parts(_Group(_Rank([3, 4])), 8)
    assert next(parts) == {"__0_8.distcp": b"x"}
    with pytest.raises(StagedCheckpointSuperseded, match=r"staged anew .*\[3\] then \[4\]"):
        next(parts)
    with pytest.raises(StagedCheckpointSuperseded):  # None: being staged again right now
        list(staged_parts(_Group(_Rank([3, None])), 8))


def test_every_rank_holds_the_step_before_any_part_is_fetched():
    rank = _Rank([3, 3])
    parts = staged_parts(_Group(rank), 8)
    next(parts)
    assert rank.calls == [("hold", 8), ("files", 8)]


def test_the_writer_tries_a_superseded_fetch_again_at_once_and_quietly(tmp_path, caplog):
    tries = []

    def fetch_staged(step):
        tries.append(step)
        if len(tries) == 1:
            raise StagedCheckpointSuperseded(f"step {step} was staged anew")
        return iter(_parts(step))

    writer = DiskCheckpointer(CheckpointDirectory(str(tmp_path)), StagedShards(fetch_staged),
                              "m.Op")
    with caplog.at_level(logging.INFO, logger="raysgd"):
        writer.commit_moved(Commit(5, 0, 2, [None, None], 1), in_epoch=False)
        assert writer.flush(30)
        writer.close()
    assert tries == [5, 5] and writer.never_written == [] and writer.failed_tries == 0
    assert [e["step"] for e in writer.directory.entries()] == [5]
    assert not caplog.records


KILLED_RANK = """
import os, signal
from raysgd.state.disk_schedule import DiskSchedule
from raysgd.worker.staging import DiskStaging
staging = DiskStaging(DiskSchedule(), rank=1)
os.makedirs(os.path.join(staging.root, "step-4"))
print(staging.root, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # never reaches close(), as a SIGKILLed rank
"""


def test_staging_removes_the_directories_of_processes_that_are_gone(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    killed = subprocess.run([sys.executable, "-c", KILLED_RANK], capture_output=True, text=True,
                            env=env, timeout=120)
    orphan = killed.stdout.strip()
    assert killed.returncode == -signal.SIGKILL and os.path.isdir(orphan), killed.stderr
    first_tempdir, tempfile.tempdir = tempfile.tempdir, str(tmp_path)
    try:
        alive = DiskStaging(DiskSchedule(), rank=0)  # a live rank of this node
        assert not os.path.exists(orphan)  # its process is gone: removed
        starting = tmp_path / f"{PREFIX}starting"  # no owner file yet (or an older layout)
        starting.mkdir()
        other = DiskStaging(DiskSchedule(), rank=1)
        assert os.path.isdir(alive.root) and starting.is_dir()  # not judged dead
    finally:
        tempfile.tempdir = first_tempdir
    for staging in (alive, other):
        staging.close()
        assert not os.path.exists(staging.root)


def _parts(step, world=2):
    parts = []
    for rank in range(world):
        staging = DiskStaging(DiskSchedule(), rank)
        staging.stage(step, True, _state(rank, step), _fake_dcp(rank))
        parts.append(staging.staged_files(step))
        staging.close()
    return parts


def _meta(step, world=2):
    return {"operator": "m.Op", "world_size": world, "step": step, "epoch": 1}


def test_a_sharded_directory_round_trips_every_ranks_part(tmp_path):
    store = LocalStore(str(tmp_path))
    path = write_dir(iter(_parts(12)), _meta(12), store, "checkpoint-000001")
    assert sorted(os.listdir(path)) == sorted([".metadata", "__0_0.distcp", "__1_0.distcp",
                                               RUN_FILE, "raysgd-rank0.pt", "raysgd-rank1.pt"])
    meta, parts = read_dir(store, "checkpoint-000001")
    assert meta == _meta(12) and [p["global_step"] for p in parts] == [12, 12]
    assert sorted(parts[0][SHARDED_KEY]["files"]) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert parts[0]["schedulers"] == [{"last_epoch": 12}] and SHARDED_KEY not in parts[1]
    assert {key: parts[0][SHARDED_KEY][key] for key in ("models", "optimizers",
                                                          "fresh_optimizers")} == \
        {"models": 1, "optimizers": 1, "fresh_optimizers": [0]}
    # The resume path: the same snapshots a checkpoint file gives, rank by rank.
    _, snapshots = to_snapshots({**parts[0], RANKS_KEY: parts[1:], RUN_KEY: meta})
    assert [s["world_size"] for s in snapshots] == [2, 2] and snapshots[0]["step"] == 12


def test_an_incomplete_staged_checkpoint_is_not_written(tmp_path):
    with pytest.raises(CheckpointError, match=r"incomplete \(ranks \[0\] of 2"):
        write_dir(iter(_parts(4)[:1]), _meta(4), LocalStore(str(tmp_path)), "checkpoint-000001")
    assert os.listdir(tmp_path) == []  # neither the checkpoint nor a temp directory


def test_the_run_directory_keeps_retires_and_rebuilds_sharded_checkpoints(tmp_path, caplog):
    directory = CheckpointDirectory(str(tmp_path), keep=2)
    for step in (4, 8, 12):
        parts = _parts(step)
        directory.write(lambda store, rel, p=parts, s=step: write_dir(iter(p), _meta(s), store,
                                                                       rel), _meta(step))
    names = sorted(name for name in os.listdir(tmp_path) if name.startswith("checkpoint-"))
    assert names == ["checkpoint-000002", "checkpoint-000003"]  # directories, the oldest gone
    state, entry = directory.load_latest()
    assert entry["step"] == 12 and state[RUN_KEY]["step"] == 12 and len(state[RANKS_KEY]) == 1
    os.unlink(tmp_path / INDEX)
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        state, entry = directory.load_latest()
    assert entry["file"] == "checkpoint-000003" and "rebuilt it from 2" in caplog.text
    stale = tmp_path / ".tmp-crashed.raysgd"
    stale.mkdir()
    (stale / "__0_0.distcp").write_bytes(b"x")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    directory.write(lambda store, rel: write_dir(iter(_parts(16)), _meta(16), store, rel),
                    _meta(16))
    assert not stale.exists()


def test_the_disk_writer_fetches_staged_shards_into_numbered_directories(tmp_path):
    fetched = []

    def fetch_staged(step):
        fetched.append(step)
        return iter(_parts(step))

    writer = DiskCheckpointer(CheckpointDirectory(str(tmp_path)), StagedShards(fetch_staged),
                              "m.Op", every_n_steps=4)
    writer.commit_moved(Commit(4, 0, 2, [None, None], 0), in_epoch=True)
    writer.flush()  # else the next commit replaces it before it is written
    writer.commit_moved(Commit(6, 0, 2, [None, None], 0), in_epoch=True)  # not a multiple
    writer.commit_moved(Commit(7, 0, 2, [None, None], 1), in_epoch=False)  # a call's end
    writer.close()
    assert fetched == [4, 7]
    entries = writer.directory.entries()
    assert [(e["file"], e["step"]) for e in entries] == [("checkpoint-000001", 4),
                                                          ("checkpoint-000002", 7)]
    with open(tmp_path / "checkpoint-000002" / RUN_FILE) as handle:
        assert json.load(handle)["epoch"] == 1


def test_files_named_by_path_stay_readable_until_unpinned():
    """A rank on the driver's node names its files (hard links of their own), so the rank
    may rotate or replace the step while the driver still links or uploads them."""
    from raysgd.state.dirblob import unpin

    staging = DiskStaging(DiskSchedule(every_n_steps=1), rank=0)
    try:
        staging.stage(1, False, _state(0, 1), _fake_dcp(0))
        refs = staging.staged_files(1, by_path=True)
        for step in range(2, 6):  # step 1 rotates out (KEEP newest)
            staging.stage(step, False, _state(0, step), _fake_dcp(0))
        assert 1 not in staging._writes
        part = checkpoint_io.from_bytes(open(refs["raysgd-rank0.pt"], "rb").read())
        assert part["global_step"] == 1
        unpin(refs)
        assert not any(os.path.exists(path) for path in refs.values())
    finally:
        staging.close()


def test_a_ranks_failed_fetch_says_why_not_only_which_task_failed():
    """Ray's error from the actor begins with the task's name and process; the warning
    names the rank's own reason (it used to end at "ray::_WorkerActor.staged_files()")."""
    from ray.exceptions import RayTaskError

    from raysgd.driver.staged import _call

    def fetch(step):
        try:
            raise CheckpointError(f"rank 1 has no staged checkpoint of step {step}")
        except CheckpointError as cause:
            raise RayTaskError("staged_files", "ray::_WorkerActor.staged_files() (pid=1)\n...",
                               cause).as_instanceof_cause() from None

    with pytest.raises(CheckpointError, match=r"step 12 could not be fetched \(RayTaskError\("
                                              r"CheckpointError\): rank 1 has no staged"):
        _call(12, fetch, 12)
