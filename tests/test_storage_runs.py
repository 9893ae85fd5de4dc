"""Trainers whose checkpoint_dir is on S3 (a real endpoint, moto's server on localhost), on
real Ray with real gloo groups: checkpoints, best, metrics.csv, save/load, resume in a new
trainer, an outage mid-run, refusals before any worker starts, and an FSDP checkpoint that
plain torch reads after downloading it from the bucket."""
import csv
import io
import logging
import time

import pytest

from fsdp_operators import Block
from operators_for_tests import LinearOperator
from raysgd import FSDP, TorchTrainer
from raysgd.errors import ConfigError
from raysgd.state.checkpoint_dir import BEST, CheckpointDirectory
from raysgd.storage.store import open_store
from raysgd.utils import BATCH_SIZE
from test_fsdp import assert_plain_torch_reads, assert_same_state, make, trained_state
from test_run_dir import SHUFFLED, _same, _weights


def _directory(uri):
    return CheckpointDirectory(open_store(uri))


def test_a_run_on_s3_checkpoints_logs_and_resumes_in_a_new_trainer(trainer_factory, s3_run):
    trainer = trainer_factory(config=SHUFFLED, checkpoint_dir=s3_run, keep_checkpoints=2,
                              checkpoint_score_attr="val_loss")
    losses = []
    for _ in range(3):
        trainer.train()
        losses.append(trainer.validate()["val_loss"])
    weights = _weights(trainer)
    saved = trainer.save(s3_run + "-saved/model.pt")
    trainer.shutdown()
    assert trainer.unwritten_checkpoints == []
    directory = _directory(s3_run)
    entries = directory.entries()
    assert entries[-1]["epoch"] == 3 and len(entries) <= 2
    assert [n for n in directory.store.names() if n.startswith("checkpoint-")] == \
        [e["file"] for e in entries]
    assert directory.best()["score"] == pytest.approx(min(losses))
    assert directory.store.exists(BEST)
    rows = list(csv.DictReader(io.StringIO(directory.store.read("metrics.csv").decode())))
    assert [r["epoch"] for r in rows] == ["1", "1", "2", "2", "3", "3"]
    # A new trainer on the same URI resumes; its metrics.csv goes on from the old rows.
    second = trainer_factory(config=SHUFFLED, checkpoint_dir=s3_run)
    assert second.epoch == 3 and _same(_weights(second), weights)
    second.train()
    second.shutdown()
    rows = list(csv.DictReader(io.StringIO(directory.store.read("metrics.csv").decode())))
    assert [r["epoch"] for r in rows] == ["1", "1", "2", "2", "3", "3", "4"]
    # save() wrote one object on S3; load() takes it, and a checkpoint of the run directory.
    third = trainer_factory(config=SHUFFLED)
    third.load(saved)
    assert _same(_weights(third), weights)
    third.load(directory.location(entries[-1]["file"]))
    assert _same(_weights(third), weights)


def test_bad_storage_is_refused_before_any_worker_starts(ray_cpus, s3_endpoint):
    started = time.monotonic()
    with pytest.raises(ConfigError, match="s3://raysgd-missing-bucket/run.*does not exist"):
        TorchTrainer(LinearOperator, num_workers=2, checkpoint_dir="s3://raysgd-missing-bucket/run")
    with pytest.raises(ConfigError, match="scheme 'ftp'"):
        TorchTrainer(LinearOperator, num_workers=2, checkpoint_dir="ftp://host/run")
    assert time.monotonic() - started < 10


def test_an_outage_mid_run_loses_nothing_it_reported_complete(trainer_factory, s3_endpoint,
                                                             s3_run, caplog):
    """The endpoint stops between two calls and comes back: training never stopped, the
    writes were retried, and every checkpoint the index lists reads back."""
    fs = s3_endpoint.filesystem(attempts=1)  # fail at once while it is down
    path = s3_run[len("s3://"):]
    trainer = trainer_factory(config=SHUFFLED, checkpoint_dir=path, storage_filesystem=fs,
                              keep_checkpoints=None)
    trainer.train()
    trainer._recorder.checkpointer.flush(30)
    s3_endpoint.stop()
    try:
        with caplog.at_level(logging.WARNING, logger="raysgd"):
            trainer.train()  # its checkpoint fails; training does not wait
            deadline = time.monotonic() + 30
            while "retrying with backoff" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.1)
            assert "retrying with backoff" in caplog.text
    finally:
        s3_endpoint.start()
    trainer.train()
    weights = _weights(trainer)
    trainer.shutdown()
    directory = CheckpointDirectory(open_store(path, fs))
    entries = directory.entries()
    assert entries[-1]["epoch"] == 3 and trainer.unwritten_checkpoints in ([], [10])
    for entry in entries:  # every listed checkpoint is complete
        directory.store.read(entry["file"])
    resumed = trainer_factory(config=SHUFFLED, checkpoint_dir=path, storage_filesystem=fs)
    assert resumed.epoch == 3 and _same(_weights(resumed), weights)


def test_an_fsdp_checkpoint_on_s3_resumes_and_plain_torch_reads_it(ray_cpus, s3_run, tmp_path):
    """Each rank's shards are written in the background (DCP async_save, the default on GPUs,
    asked for here on CPUs) and uploaded by the driver; the directory counts once its marker
    is there."""
    want = trained_state(FSDP(units=Block, async_checkpoints=True), checkpoint_dir=s3_run,
                         checkpoint_every_n_steps=2, checkpoint_every_n_steps_to_disk=4)
    directory = _directory(s3_run)
    latest = directory.entries()[-1]["file"]
    local = tmp_path / latest
    for rel in directory.store.files(latest):  # download the directory, as a user would
        (local / rel).parent.mkdir(parents=True, exist_ok=True)
        (local / rel).write_bytes(directory.store.read(f"{latest}/{rel}"))
    assert_plain_torch_reads(local, want, tmp_path / "plain.pt")
    resumed = make(FSDP(units=Block), num_workers=3, checkpoint_dir=s3_run,
                   config={BATCH_SIZE: 48})  # another worker count: DCP reshards
    try:
        assert resumed.epoch == 2
        assert_same_state(resumed.state_dict(), want)
    finally:
        resumed.shutdown()


def test_the_drivers_node_draining_writes_that_step_to_storage_at_once(trainer_factory,
                                                                       s3_run, tmp_path):
    """The notice comes from the drain watch (here given the driver's own node once rank 0
    is past step 5, as Ray's draining-node list would after `ray drain-node`): the ranks
    stop at one step, that step's checkpoint reaches S3 though no in-epoch checkpoint is on
    the disk schedule, and the call then finishes its pass."""
    from operators_for_tests import FaultyOperator, read_step
    from raysgd.driver import placement
    from raysgd.driver.preemption import DrainWatch

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    trainer = trainer_factory(FaultyOperator, checkpoint_dir=s3_run, checkpoint_every_n_steps=2,
                              config={BATCH_SIZE: 32, "data_size": 1280, "sleep_s": 0.05,
                                      "pid_dir": str(pid_dir)})
    node = placement.driver_node()
    deadline_ms = int((time.time() + 60) * 1000)
    trainer._supervisor.drains = DrainWatch(
        lambda: {node: deadline_ms} if read_step(str(pid_dir)) >= 5 else {}, every_s=0.0)
    trainer.train()
    trainer._recorder.checkpointer.flush(30)  # the call-end checkpoint follows the call
    steps = [entry["step"] for entry in _directory(s3_run).entries()]
    assert steps[-1] == 40 and len(steps) == 2 and 5 <= steps[0] < 40, steps  # the stop's
    assert trainer.recovery_stats.preemptions == 0 and trainer.epoch == 1
    trainer.train()  # once per drain: no second stop
    trainer._recorder.checkpointer.flush(30)
    assert [entry["step"] for entry in _directory(s3_run).entries()] == steps + [80]
