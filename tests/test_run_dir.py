"""Disk checkpoints, resume and loggers on a real trainer (real Ray, real gloo groups)."""
import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

from operators_for_tests import LinearOperator
from raysgd import TorchTrainer
from raysgd.errors import CheckpointError
from raysgd.loggers import CSVLogger, Logger, TensorBoardLogger
from raysgd.state.checkpoint_dir import BEST, INDEX, CheckpointDirectory
from raysgd.storage.store import open_store

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
SHUFFLED = {"shuffle": True, "data_size": 320, "lr": 5e-2}


def _weights(trainer) -> dict:
    return {k: v.clone() for k, v in trainer.get_model().state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _index(path) -> dict:
    return json.loads((path / INDEX).read_text())


def _one_epoch_in(run_dir, trainer_factory, operator=LinearOperator) -> None:
    """A run that trains one epoch into ``run_dir`` and shuts down (its checkpoint on disk)."""
    trainer = trainer_factory(operator, config=SHUFFLED, checkpoint_dir=str(run_dir))
    trainer.train()
    trainer.shutdown()


class OtherOperator(LinearOperator):
    pass


def test_train_writes_checkpoints_and_a_new_trainer_resumes(trainer_factory, tmp_path):
    first = trainer_factory(config=SHUFFLED, checkpoint_dir=str(tmp_path), keep_checkpoints=2)
    for _ in range(3):
        first.train()
    assert first.epoch == 3
    weights = _weights(first)
    first.shutdown()  # waits for the last checkpoint
    index = _index(tmp_path)
    # A call-end commit still waiting when the next arrives is skipped: epoch 2's may be.
    assert index["checkpoints"][-1]["epoch"] == 3 and len(index["checkpoints"]) <= 2
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("checkpoint-")) == \
        [e["file"] for e in index["checkpoints"]]
    second = trainer_factory(config=SHUFFLED, checkpoint_dir=str(tmp_path))
    assert second.epoch == 3 and _same(_weights(second), weights)
    second.train()
    assert second.epoch == 4
    # A checkpoint written here is an ordinary save() file: load() takes it.
    third = trainer_factory(config=SHUFFLED)
    third.load(str(tmp_path / index["latest"]))
    assert _same(_weights(third), weights)


def test_resume_mid_pass_matches_an_uninterrupted_run_bitwise(trainer_factory, tmp_path):
    plain = trainer_factory(config=SHUFFLED)
    for _ in range(3):
        plain.train()
    expected = _weights(plain)
    # 320 samples, 2 workers, batch 32: 5 batches per pass; stop 2 batches into pass 2.
    cut = trainer_factory(config=SHUFFLED, checkpoint_dir=str(tmp_path))
    cut.train()
    cut.train(num_steps=2)
    assert cut.epoch == 1
    cut.shutdown()
    resumed = trainer_factory(config=SHUFFLED, checkpoint_dir=str(tmp_path))
    assert resumed.epoch == 1
    while resumed.epoch < 3:
        resumed.train()
    assert _same(_weights(resumed), expected)


def test_resume_false_starts_over_with_its_own_best(trainer_factory, tmp_path):
    converging = {**SHUFFLED, "lr": 1e-2}
    first = trainer_factory(config=converging, checkpoint_dir=str(tmp_path),
                            checkpoint_score_attr="train_loss")
    for _ in range(3):
        first.train()
    first.shutdown()
    old_best = _index(tmp_path)["best"]["score"]
    again = trainer_factory(config=converging, checkpoint_dir=str(tmp_path), resume=False,
                            checkpoint_score_attr="train_loss")
    assert again.epoch == 0
    loss = again.train()["train_loss"]
    again.shutdown()
    assert loss > old_best and _index(tmp_path)["best"]["score"] == pytest.approx(loss)


class SetupFails(LinearOperator):
    def setup(self, config):
        if config.get("broken"):
            raise FileNotFoundError("dataset missing")
        super().setup(config)


def test_a_setup_error_while_resuming_keeps_its_type(trainer_factory, tmp_path):
    _one_epoch_in(tmp_path, trainer_factory, SetupFails)
    with pytest.raises(FileNotFoundError, match="dataset missing"):
        trainer_factory(SetupFails, config={**SHUFFLED, "broken": True},
                        checkpoint_dir=str(tmp_path))


def test_a_logger_that_cannot_start_fails_before_any_worker(trainer_factory, tmp_path):
    from raysgd.errors import ConfigError

    with pytest.raises(ConfigError, match="CSVLogger needs a path"):
        trainer_factory(config=SHUFFLED, loggers=[CSVLogger()])
    # ray_cpus (through trainer_factory) checks that every CPU came back.


def test_tune_trainables_refuse_a_shared_checkpoint_dir(tmp_path):
    from raysgd.errors import ConfigError

    with pytest.raises(ConfigError, match="every trial would share it"):
        TorchTrainer.as_trainable(training_operator_cls=LinearOperator,
                                  checkpoint_dir=str(tmp_path))


def test_checkpoint_of_another_operator_is_refused(trainer_factory, tmp_path):
    _one_epoch_in(tmp_path, trainer_factory)
    with pytest.raises(CheckpointError, match="LinearOperator.*OtherOperator"):
        trainer_factory(OtherOperator, config=SHUFFLED, checkpoint_dir=str(tmp_path))


class WideOperator(LinearOperator):
    """With ``config["wide"]`` the same class registers a model the checkpoint does not fit."""

    def setup(self, config):
        if not config.get("wide"):
            return super().setup(config)
        model = nn.Linear(1, 3)
        self.register(models=model, optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      criterion=nn.MSELoss())


def test_checkpoint_with_incompatible_models_is_refused_not_half_loaded(trainer_factory, tmp_path):
    _one_epoch_in(tmp_path, trainer_factory, WideOperator)
    with pytest.raises(CheckpointError, match="does not fit WideOperator.*resume=False"):
        trainer_factory(WideOperator, config={**SHUFFLED, "wide": True},
                        checkpoint_dir=str(tmp_path))


def test_best_checkpoint_and_default_metrics_csv(trainer_factory, tmp_path):
    trainer = trainer_factory(config=SHUFFLED, checkpoint_dir=str(tmp_path),
                              checkpoint_score_attr="val_loss")
    losses = []
    for _ in range(3):
        trainer.train()
        losses.append(trainer.validate()["val_loss"])
    trainer.shutdown()
    best = _index(tmp_path)["best"]
    assert best["score"] == pytest.approx(min(losses)) and (tmp_path / BEST).exists()
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [r["epoch"] for r in rows] == ["1", "1", "2", "2", "3", "3"]
    assert [float(r["val_loss"]) for r in rows if r["val_loss"]] == pytest.approx(losses)
    assert all(float(r["train_samples_per_s"]) > 0 for r in rows if r["train_loss"])
    assert int(rows[-1]["step"]) == 15  # 5 batches per pass on each worker


class ExplodingLogger(Logger):
    def __init__(self):
        self.calls = 0

    def log_metrics(self, metrics, step):
        self.calls += 1
        raise RuntimeError("tracking server is down")


def test_a_failing_logger_does_not_stop_training(trainer_factory, tmp_path, caplog):
    tb_dir = tmp_path / "tb"
    trainer = trainer_factory(config=SHUFFLED, loggers=[
        ExplodingLogger(), CSVLogger(str(tmp_path / "m.csv")), TensorBoardLogger(str(tb_dir))])
    for _ in range(2):
        trainer.train()
    trainer.validate()
    trainer.shutdown()
    assert "tracking server is down" in caplog.text
    exploding = [r for r in caplog.records if "tracking server is down" in r.getMessage()]
    assert len(exploding) == 1  # reported once, then switched off
    rows = list(csv.DictReader(open(tmp_path / "m.csv")))
    assert len(rows) == 3 and rows[0]["train_loss"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tb_dir))
    events.Reload()
    assert [e.step for e in events.Scalars("train_loss")] == [5, 10]


_PLAIN = {}  # strategy -> the uninterrupted run's weights (storage does not change them)


@pytest.mark.slow
@pytest.mark.parametrize("strategy,storage", [("ddp", "local"), ("fsdp", "local"),
                                              ("ddp", "s3"), ("fsdp-async", "s3")])
def test_driver_sigkilled_mid_epoch_resumes_to_the_same_weights(tmp_path, strategy, storage,
                                                                request):
    """The promise: kill -9 the driver, run the script again, same final weights (under
    FSDP from sharded DCP checkpoint directories that every rank wrote, in place or in the
    background), locally and on S3. (A directory a kill cuts short is invisible to the
    resume: test_storage's test_a_directory_cut_short_is_invisible_and_cleaned_up.)"""
    script = os.path.join(TESTS_DIR, "resume_driver.py")

    def run(run_dir, out, *extra):
        return subprocess.Popen([sys.executable, script, "--dir", str(run_dir), "--out", str(out),
                                 "--strategy", strategy, *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    trained = strategy.split("-")[0]  # how shards are written does not change the weights
    plain = None if trained in _PLAIN else run(tmp_path / "plain", tmp_path / "plain.pt")
    killed = request.getfixturevalue("s3_run") if storage == "s3" else tmp_path / "killed"
    # The victim stops before step 21 (pass 2 of 16-step passes), so the kill lands after
    # the mid-pass checkpoint of step 20, however slow the machine (a kill timed by watching
    # the checkpoints could miss it when the writer skipped to a newer commit).
    victim = run(killed, tmp_path / "never.pt", "--hang-at", str(KILLED_AT))
    try:
        _wait_for_checkpoint(killed, victim, KILLED_AT)
    except BaseException:  # a hung victim would sleep on for an hour
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        raise
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(30)
    _reap_group(victim)
    again = run(killed, tmp_path / "resumed.pt")  # while the uninterrupted run finishes
    try:
        if plain is not None:
            assert plain.wait(240) == 0, plain.communicate()[1][-3000:]
            _PLAIN[trained] = torch.load(tmp_path / "plain.pt")
        out, err = again.communicate(timeout=240)
    finally:
        if again.poll() is None:
            os.killpg(again.pid, signal.SIGKILL)
            again.wait(30)
    assert again.returncode == 0, err[-3000:]
    resumed_step = int(err.split("resumed from ")[1].split("step ")[1].split()[0])
    assert resumed_step == KILLED_AT  # inside a pass: the resume replays the pass's rest
    got = torch.load(tmp_path / "resumed.pt")
    assert _same(got, _PLAIN[trained])


KILLED_AT = 20  # a checkpoint every 4 steps, 16 per pass: the first of pass 2


def _wait_for_checkpoint(run_dir, process, step: int, timeout_s: float = 120.0) -> None:
    """Wait until the newest checkpoint in ``run_dir`` is of ``step``."""
    deadline = time.monotonic() + timeout_s
    directory = CheckpointDirectory(open_store(str(run_dir)))
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1][-3000:]
        try:
            entries = json.loads(directory.store.read(INDEX))["checkpoints"]
        except (OSError, ValueError):
            entries = []
        if entries and entries[-1]["step"] == step:
            return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint of step {step} appeared")


LINGERING = ("ray::DashboardAgent", "ray::RuntimeEnvAgent")


def _reap_group(process) -> None:
    """The killed driver's raylet and workers die with it, but Ray 2.60's dashboard and
    runtime-env agents can linger for minutes; they hold nothing of ours. Wait (5 s at most)
    until only they are left, then kill the group."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = _group_members(process.pid)
        if not left:
            return
        if all(cmdline.startswith(LINGERING) for cmdline in left):
            break
        time.sleep(0.1)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _group_members(pgid: int) -> list:
    """The command lines of the live processes in process group ``pgid`` (zombies have ended)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            with open(f"/proc/{entry}/cmdline") as cmdline:
                members.append(cmdline.read().replace("\0", " ").strip())
        except (OSError, IndexError, ValueError):
            pass
    return members
