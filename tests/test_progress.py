"""Progress bars: worker-side counters, the driver-side bar, and the use_tqdm setting."""
import io
import os
import re
import subprocess
import sys
import textwrap

import pytest

from operators_for_tests import LegacyEpochOperator, LinearOperator
from raysgd import TorchTrainer
from raysgd.config import RankInfo, WorkerSettings
from raysgd.driver.progress import NULL_PROGRESS, ProgressBar, make_progress
from raysgd.errors import ConfigError
from raysgd.utils import BATCH_SIZE
from raysgd.worker.progress import BatchEvents
from raysgd.worker.runner import WorkerRunner

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bar_states(text):
    """Every state a tqdm bar drew (it redraws with carriage returns)."""
    return [s.strip() for s in re.split(r"[\r\n]", text) if s.strip()]


def report(done, total, samples, **metrics):
    return {"call": {"kind": "train", "done": done, "total": total, "samples": samples,
                     "metrics": metrics}}


# ---------------------------------------------------------------- worker side
def test_events_count_batches_samples_and_keep_the_last_metrics():
    events = BatchEvents()
    events.begin("train", 10)
    for loss in (0.5, 0.25):
        events.fetched_batch()
        events.finished_batch({"train_loss": loss, "name": "not a number"}, 32)
    assert events.report() == {"kind": "train", "done": 2, "total": 10, "samples": 64,
                               "metrics": {"train_loss": 0.25}}


def test_a_device_loss_is_read_at_most_once_a_second(monkeypatch):
    import torch

    from raysgd.worker import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    events = BatchEvents()
    events.begin("train", 10)
    # A meta tensor stands for a GPU loss: reading it raises, so no read happened.
    for _ in range(3):
        events.finished_batch({"train_loss": torch.tensor(1.0, device="meta"), "lr": 0.1}, 8)
        clock[0] += 0.2
    assert events.report()["metrics"] == {"lr": 0.1}
    assert events.report()["samples"] == 24
    clock[0] += 1.0  # a second after the last read: this batch's loss is read
    with pytest.raises((RuntimeError, NotImplementedError)):
        events.finished_batch({"train_loss": torch.tensor(1.0, device="meta")}, 8)
    events.begin("train", 10)
    events.finished_batch({"train_loss": torch.tensor(0.5)}, 8)  # on the CPU: read at once
    assert events.report()["metrics"] == {"train_loss": 0.5}


def test_events_fall_back_to_fetched_batches_for_loops_that_report_none():
    events = BatchEvents()
    events.begin("train", 10, done=4)  # a call resumed after 4 batches
    assert events.report()["done"] == 4
    for _ in range(3):
        events.fetched_batch()
    assert events.report()["done"] == 6  # the third is still in flight


def make_runner(cls, config):
    runner = WorkerRunner(cls, config, WorkerSettings(), RankInfo())
    runner.setup_operator()
    return runner


def test_runner_reports_each_call_with_its_length():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100})  # 10 batches a pass
    runner.train_epoch(num_steps=4)
    call = runner.progress()["call"]
    assert (call["kind"], call["done"], call["total"], call["samples"]) == ("train", 4, 4, 400)
    assert set(call["metrics"]) == {"train_loss"}
    runner.train_epoch()  # the rest of the pass: 6 batches
    assert (runner.progress()["call"]["done"], runner.progress()["call"]["total"]) == (6, 6)
    runner.validate(num_steps=2)
    call = runner.progress()["call"]
    assert (call["kind"], call["done"], call["total"]) == ("validate", 2, 2)
    assert {"val_loss", "val_accuracy"} == set(call["metrics"])


def test_runner_counts_batches_of_an_overridden_train_epoch():
    runner = make_runner(LegacyEpochOperator, {BATCH_SIZE: 100})
    runner.train_epoch()
    assert runner.progress()["call"]["done"] == 9  # the last fetched batch counts as in flight


# ---------------------------------------------------------------- driver side
def test_bar_follows_rank_zero_and_sums_samples_over_ranks():
    now = [0.0]
    out = io.StringIO()
    bar = ProgressBar("train", file=out, clock=lambda: now[0])
    now[0] = 2.0
    bar.update({0: report(3, 10, 300, train_loss=0.123456), 1: report(2, 10, 200)})
    bar._bar.refresh()
    state = bar_states(out.getvalue())[-1]
    assert state.startswith("train:") and "3/10" in state
    assert "train_loss=0.1235" in state and "samples/s=250" in state
    now[0] = 4.0
    bar.close({"train_loss": 0.1, "last_train_loss": 0.09, "epoch": 1, "num_samples": 1000},
              done=10)
    final = bar_states(out.getvalue())[-1]
    assert "10/10" in final and "100%" in final and "train_loss=0.1" in final
    assert "last_" not in final and "samples/s=250" in final


def test_bar_of_a_call_shorter_than_a_poll_shows_its_length_at_the_end():
    out = io.StringIO()
    bar = ProgressBar("validate", file=out)
    bar.close({"val_loss": 0.5, "num_samples": 70}, done=7)
    assert "7/7" in bar_states(out.getvalue())[-1]


def test_bar_of_a_failed_call_stops_where_it_was():
    out = io.StringIO()
    bar = ProgressBar("validate", file=out)
    bar.update({0: report(3, 10, 30)})
    bar.close()
    assert "3/10" in bar_states(out.getvalue())[-1]


def test_bar_ignores_reports_from_before_the_call_started():
    bar = ProgressBar("train", file=io.StringIO())
    bar.update({})
    bar.update({0: {"steps": 0, "idle_s": 0.0}})
    assert bar._bar.n == 0
    bar.close()


def test_use_tqdm_resolves_once_to_a_bar_or_nothing():
    assert make_progress(False)("train") is NULL_PROGRESS
    # True means "when interactive": a pipe or a log file gets no bar.
    assert make_progress(True, file=io.StringIO())("train") is NULL_PROGRESS
    assert isinstance(make_progress("always", file=io.StringIO())("train"), ProgressBar)


@pytest.mark.parametrize("value", ["yes", 2, None])
def test_bad_use_tqdm_fails_before_any_worker_starts(value):
    class NeverStarted:
        def __init__(self, *args, **kwargs):
            raise AssertionError("a worker group was created")

    with pytest.raises(ConfigError, match="use_tqdm must be False, True"):
        TorchTrainer(training_operator_cls=LinearOperator, use_tqdm=value,
                     _worker_group_cls=NeverStarted)


# ----------------------------------------------------- real workers, real output
DRIVER_SCRIPT = textwrap.dedent('''
    import ray
    from operators_for_tests import SlowOperator
    from raysgd import TorchTrainer
    from raysgd.utils import BATCH_SIZE

    ray.init(num_cpus=2)
    trainer = TorchTrainer(training_operator_cls=SlowOperator, num_workers=2, use_tqdm="always",
                           config={BATCH_SIZE: 64, "sleep_s": 0.05, "data_size": 1280})
    trainer.train()
    trainer.validate()
    trainer.shutdown()
''')


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_driver_draws_one_bar_per_call_fed_while_workers_train(tmp_path):
    script = tmp_path / "progress_driver.py"
    script.write_text(DRIVER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "tests"), ROOT]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=170, env=env, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    states = bar_states(out.stderr)
    train = [s for s in states if s.startswith("train:")]
    validate = [s for s in states if s.startswith("validate:")]
    # 1280 samples / 2 workers / 32 per worker: 20 batches; 400 / 2 / 32: 7 validation batches.
    assert train and "20/20" in train[-1] and "train_loss=" in train[-1], train
    assert validate and "7/7" in validate[-1] and "val_accuracy=" in validate[-1], validate
    # Drawn while the workers trained, not only at the end.
    middle = [s for s in train if re.search(r"\b([1-9]|1[0-9])/20\b", s)]
    assert middle, train
    # Never printed by a worker (Ray prefixes forwarded worker output with the actor's name).
    assert not [s for s in states if "pid=" in s and "batch" in s]
    print("\n".join(train[-1:] + validate[-1:]))
