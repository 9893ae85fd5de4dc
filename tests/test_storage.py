"""Run directories on S3: a real S3-compatible endpoint (moto's server) on localhost, no Ray.

The checkpoint directory, the sharded-directory writer, the write probe and the log mirror
against real object storage: complete-or-invisible directories, retention, refusals on the
driver, an outage and its recovery. The trainer-level runs are in test_storage_runs.py.
"""
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time

import pyarrow.fs
import pytest
import torch

from raysgd.errors import CheckpointError, ConfigError
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.checkpoint_dir import INDEX, RANKS_KEY, CheckpointDirectory
from raysgd.state.commit import Commit
from raysgd.state.commit_files import CommitFiles
from raysgd.state.disk_checkpoints import DiskCheckpointer
from raysgd.state.dirblob import pin_files
from raysgd.state.sharded_dir import RUN_FILE, read_dir, write_dir
from raysgd.storage.mirror import LogMirror
from raysgd.storage.probe import check_store, hint_for
from raysgd.storage.store import ArrowStore, FileRef, LocalStore, open_store, split_target
from test_checkpoint_dir import _bytes, _commit
from s3_server import free_port
from test_sharded_dir import _meta, _parts


def _weight(store, name):
    return checkpoint_io.from_bytes(store.read(name))["models"][0]["w"].item()


def _sharded(step):
    return lambda store, rel: write_dir(iter(_parts(step)), _meta(step), store, rel)


# ------------------------------------------------------------------- opening
def test_uris_open_the_right_store(tmp_path, s3_run):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    assert open_store(f"file://{tmp_path}").root == str(tmp_path)
    store = open_store(s3_run)
    assert isinstance(store, ArrowStore) and store.uri == s3_run
    assert store.fs.type_name == "s3" and store.root == s3_run[len("s3://"):]
    given = pyarrow.fs.LocalFileSystem()
    assert isinstance(open_store(str(tmp_path), given), LocalStore)
    store, name = split_target(s3_run + "/model.pt")
    assert (store.uri, name) == (s3_run, "model.pt")
    with pytest.raises(ConfigError, match="names a bucket"):
        split_target("s3://bucket")


def test_the_probe_refuses_what_cannot_be_written_on_the_driver(s3_endpoint, s3_run):
    check_store(open_store(s3_run))  # the endpoint and bucket work
    assert open_store(s3_run).names() == []  # and the probe left nothing behind
    with pytest.raises(ConfigError, match="s3://no-such-bucket-here/run.*bucket does not exist"):
        check_store(open_store("s3://no-such-bucket-here/run"))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="endpoint cannot be reached"):
        check_store(open_store("s3://bucket/run?endpoint_override=http://127.0.0.1:9"))
    assert time.monotonic() - started < 20


def test_refused_credentials_are_a_config_error():
    """A second endpoint that checks keys (moto with IAM auth on): wrong credentials are
    refused on the driver, and the message says where credentials go."""
    with auth_checking_endpoint() as url:
        wrong = pyarrow.fs.S3FileSystem(endpoint_override=url, access_key="wrong",
                                        secret_key="wrong", region="us-east-1")
        with pytest.raises(ConfigError, match="bucket/run.*INVALID_ACCESS_KEY_ID.*"
                                              "AWS_ACCESS_KEY_ID"):
            check_store(open_store("bucket/run", wrong))
    assert "AWS_ACCESS_KEY_ID" in hint_for(OSError("AWS Error ACCESS_DENIED during PutObject"))
    assert "AWS_ENDPOINT_URL" in hint_for(OSError("curlCode: 7, Could not connect"))


@contextlib.contextmanager
def auth_checking_endpoint():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                               str(port)], env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.kill()
        server.wait(10)


# ------------------------------------------------------- the checkpoint directory
def test_files_and_directories_on_s3_keep_retire_and_resume(s3_run):
    directory = CheckpointDirectory(open_store(s3_run), keep=2)
    for step in (4, 8):
        directory.write(_bytes(float(step)), {"step": step})
    directory.write(_sharded(12), _meta(12))
    names = directory.store.names()
    assert names == ["checkpoint-000002.pt", "checkpoint-000003", INDEX]
    state, entry = directory.load_latest()
    assert entry["step"] == 12 and len(state[RANKS_KEY]) == 1
    directory.store.remove(INDEX)  # the index lost: rebuilt from what is complete
    assert [e["file"] for e in directory.entries()] == ["checkpoint-000002.pt",
                                                        "checkpoint-000003"]


def test_a_directory_cut_short_is_invisible_and_cleaned_up(s3_run, caplog):
    """A driver killed mid-upload: some files of the new checkpoint are on S3, its marker
    is not. Readers use the previous one; the next writer removes the leftovers."""
    directory = CheckpointDirectory(open_store(s3_run), keep=3)
    directory.write(_sharded(4), _meta(4))

    def killed_mid_upload(store, rel):
        with pytest.raises(RuntimeError):
            with store.building_dir(rel) as put:
                for name, data in _parts(8)[0].items():
                    put(name, data)
                raise RuntimeError("SIGKILL")  # no marker, no index entry
        raise SystemExit  # the driver is gone: nothing after this runs

    with pytest.raises(SystemExit):
        directory.write(killed_mid_upload, _meta(8))
    store = directory.store
    assert store.exists("checkpoint-000002/raysgd-rank0.pt")
    assert not store.exists(f"checkpoint-000002/{RUN_FILE}")
    reader = CheckpointDirectory(open_store(s3_run))  # a new driver, a new cluster
    state, entry = reader.load_latest()
    assert entry["step"] == 4
    store.remove(INDEX)
    assert [e["file"] for e in reader.entries()] == ["checkpoint-000001"]  # unmarked: skipped
    reader.write(_sharded(12), _meta(12))  # the leftover's number: its files are replaced
    state, entry = reader.load_latest()
    assert (entry["file"], state["global_step"]) == ("checkpoint-000002", 12)
    assert store.names() == ["checkpoint-000001", "checkpoint-000002", INDEX]


def test_best_directories_on_s3_are_replaced_through_the_index(s3_run):
    directory = CheckpointDirectory(open_store(s3_run))
    first = directory.write_best(_sharded(4), _meta(4), "val_loss", "min", 0.5)
    second = directory.write_best(_sharded(8), _meta(8), "val_loss", "min", 0.4)
    assert first != second and directory.best()["step"] == 8
    best = [name for name in directory.store.names() if name.startswith("best")]
    assert best == [directory.best()["file"]]  # the old one went after the index moved on
    directory.write_best(_bytes(1.0), {"step": 9}, "val_loss", "min", 0.3)
    assert [n for n in directory.store.names() if n.startswith("best")] == ["best.pt"]


# ----------------------------------------------------------- outages
def _failing_fast(endpoint, uri):
    return open_store(uri[len("s3://"):], endpoint.filesystem(attempts=1))


def test_a_storage_outage_is_retried_and_nothing_incomplete_is_listed(s3_endpoint, s3_run,
                                                                      caplog):
    directory = CheckpointDirectory(_failing_fast(s3_endpoint, s3_run), keep=10)
    writer = DiskCheckpointer(directory, CommitFiles(lambda snaps: list(snaps)), "m.Op")
    writer.commit_moved(_commit(1, 1.0), in_epoch=False)
    assert writer.flush(30)
    s3_endpoint.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="raysgd"):
            writer.commit_moved(_commit(2, 2.0), in_epoch=False)
            deadline = time.monotonic() + 30
            while not writer.failed_tries and time.monotonic() < deadline:
                time.sleep(0.1)
            assert writer.failed_tries >= 1 and "retrying with backoff" in caplog.text
    finally:
        s3_endpoint.start()
    assert writer.flush(60)
    assert writer.failed_tries == 0 and "takes checkpoints again" in caplog.text
    assert [e["step"] for e in directory.entries()] == [1, 2]
    assert writer.close() == []
    assert _weight(directory.store, directory.entries()[-1]["file"]) == 2.0


def test_checkpoints_that_never_reached_storage_are_reported_at_close(s3_endpoint, s3_run,
                                                                      caplog):
    directory = CheckpointDirectory(_failing_fast(s3_endpoint, s3_run), keep=10)
    writer = DiskCheckpointer(directory, CommitFiles(lambda snaps: list(snaps)), "m.Op")
    s3_endpoint.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="raysgd"):
            writer.commit_moved(_commit(3), in_epoch=False)
            deadline = time.monotonic() + 30
            while not writer.failed_tries and time.monotonic() < deadline:
                time.sleep(0.1)
            writer.commit_moved(_commit(4), in_epoch=False)  # replaces the failing one
            assert writer.close(timeout_s=60) == [3, 4]
        assert "never reached" in caplog.text and "[3, 4]" in caplog.text
    finally:
        s3_endpoint.start()
    assert directory.entries() == []


# ----------------------------------------------------------- loggers' files
def test_the_log_mirror_uploads_changes_and_brings_them_back(s3_run, tmp_path):
    store = open_store(s3_run)
    store.write("checkpoint-000001.pt", b"not a log")
    mirror = LogMirror(store, lambda name: name.startswith("checkpoint-"))
    (tmp_path / "x").write_text("")  # unrelated
    with open(f"{mirror.local_dir}/metrics.csv", "w") as handle:
        handle.write("step,epoch\n1,0\n")
    assert mirror.push()
    assert store.read("metrics.csv") == b"step,epoch\n1,0\n"
    os.makedirs(f"{mirror.local_dir}/tensorboard")
    with open(f"{mirror.local_dir}/tensorboard/events", "wb") as handle:
        handle.write(b"e1")
    assert mirror.close()
    again = LogMirror(store, lambda name: name.startswith("checkpoint-"))
    again.pull()
    assert sorted(os.listdir(again.local_dir)) == ["metrics.csv", "tensorboard"]
    with open(f"{again.local_dir}/tensorboard/events", "rb") as handle:
        assert handle.read() == b"e1"
    again.close()


def test_local_stores_keep_rename_semantics(tmp_path):
    store = LocalStore(str(tmp_path / "run"))
    with pytest.raises(CheckpointError):
        write_dir(iter(_parts(4)[:1]), _meta(4), store, "checkpoint-000001")
    assert store.names() == []  # neither a checkpoint nor a temporary directory
    store.write("a/b.bin", torch.zeros(1).numpy().tobytes())
    assert store.files("a") == ["b.bin"]


def test_files_placed_in_a_local_store_are_synced_there(tmp_path, monkeypatch):
    """The ranks and the DDP writer stage files unsynced (off the training path); the store
    syncs each one where it becomes part of a checkpoint, linked or written."""
    synced = set()
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.add(os.fstat(fd).st_ino) or real_fsync(fd))
    staged = tmp_path / "staged.bin"
    staged.write_bytes(b"shard")
    store = LocalStore(str(tmp_path / "run"))
    with store.building_dir("checkpoint-000001") as put:
        put("__0_0.distcp", FileRef(str(staged)))
        put("raysgd-rank1.pt", b"part")
    store.write("checkpoint-000002.pt", FileRef(str(staged)))
    placed = [tmp_path / "run" / "checkpoint-000001" / "__0_0.distcp",
              tmp_path / "run" / "checkpoint-000001" / "raysgd-rank1.pt",
              tmp_path / "run" / "checkpoint-000002.pt"]
    assert {os.stat(path).st_ino for path in placed} <= synced


def test_save_now_writes_an_off_schedule_commit_and_waits_for_it(s3_run):
    """The driver's node drains: the commit of the stop goes to storage whatever the disk
    schedule (in-epoch commits are not on it here), staged first under a sharding strategy."""
    directory = CheckpointDirectory(open_store(s3_run), keep=10)
    source = CommitFiles(lambda snaps: list(snaps))
    staged = []
    source.stage_now = lambda: staged.append(True)
    writer = DiskCheckpointer(directory, source, "m.Op")  # call ends only
    writer.commit_moved(_commit(7, 7.0), in_epoch=True)  # not on the schedule: skipped
    assert writer.flush(10) and directory.entries() == []
    assert writer.save_now(_commit(7, 7.0), timeout_s=30)
    assert staged == [True] and [e["step"] for e in directory.entries()] == [7]
    writer.close()


def test_staged_files_on_the_drivers_node_are_linked_or_uploaded_by_path(s3_run, tmp_path):
    """A rank on the driver's node names its files (FileRef): a local run directory links
    them, S3 gets them streamed from the file; the directory reads back the same."""
    staged = tmp_path / "staged"
    parts = []
    for rank, blob in enumerate(_parts(4)):
        for name, data in blob.items():
            (staged / str(rank) / name).parent.mkdir(parents=True, exist_ok=True)
            (staged / str(rank) / name).write_bytes(data)
        parts.append(pin_files(str(staged / str(rank)), str(tmp_path)))
    assert all(isinstance(ref, FileRef) for part in parts for ref in part.values())
    local = LocalStore(str(tmp_path / "run"))
    write_dir(iter(parts), _meta(4), local, "checkpoint-000001")
    linked = tmp_path / "run" / "checkpoint-000001" / "__0_0.distcp"
    assert os.stat(linked).st_ino == os.stat(staged / "0" / "__0_0.distcp").st_ino  # no copy
    remote = open_store(s3_run)
    write_dir(iter(parts), _meta(4), remote, "checkpoint-000001")
    for store in (local, remote):
        meta, read = read_dir(store, "checkpoint-000001")
        assert meta["step"] == 4 and [p["global_step"] for p in read] == [4, 4]
        assert read[0]["sharded"]["files"]["__1_0.distcp"] == \
            (staged / "1" / "__1_0.distcp").read_bytes()
