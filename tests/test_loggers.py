"""raysgd.loggers: CSV, TensorBoard, MLflow and W&B against the real libraries,
and the LoggerHub that runs them off the training thread. No Ray."""
import csv
import glob
import logging
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from raysgd.errors import ConfigError
from raysgd.loggers import (CSVLogger, Logger, LoggerHub, MLflowLogger, TensorBoardLogger,
                            WandbLogger, flatten_config)
from raysgd.loggers.mlflow_logger import mlflow_key
from raysgd.loggers.wandb_logger import StepMap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = {"lr": 0.1, "model": {"hidden": 64, "act": torch.relu}, "layers": [64, 32]}


def train_record(epoch, loss):
    return {"epoch": epoch, "train_loss": loss, "train_num_samples": 1437}


def val_record(epoch, loss):
    return {"epoch": epoch, "val_loss": loss, "val_accuracy": 0.9}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.fixture
def quiet_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)


@pytest.fixture
def file_store_env(monkeypatch):
    # MLflowLogger sets MLFLOW_ALLOW_FILE_STORE; registering it here undoes that.
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)


# ---------------------------------------------------------------- base
def test_flatten_config_keeps_plain_values_and_describes_the_rest():
    flat = flatten_config({"lr": 0.1, "n": np.int64(3), "use": True, "name": "x", "none": None,
                           "model": {"hidden": 64, "act": torch.relu, "deep": {"k": 1}},
                           "layers": [64, 32], "big": torch.zeros(1000), "empty": {}})
    assert flat["lr"] == 0.1 and flat["use"] is True and flat["name"] == "x"
    assert flat["none"] is None and flat["n"] == 3 and type(flat["n"]) is int
    assert flat["model/hidden"] == 64 and flat["model/deep/k"] == 1
    assert flat["model/act"] == "torch.relu"  # a name, not "<function ... at 0x...>"
    assert flat["layers"] == "[64, 32]" and flat["empty"] == "{}"
    assert flat["big"].startswith("tensor([0., 0.") and len(flat["big"]) <= 250
    assert flat["big"].endswith("...") and "\n" not in flat["big"]


def test_logger_base_requires_log_metrics():
    class Empty(Logger):
        pass

    Empty().setup(None, 0)  # the other methods are no-ops
    with pytest.raises(NotImplementedError, match="Empty must override log_metrics"):
        Empty().log_metrics({"a": 1.0}, 1)


# ---------------------------------------------------------------- CSV
def test_csv_columns_cells_and_new_column_rewrite(tmp_path):
    logger = CSVLogger()
    logger.setup(str(tmp_path / "run"), 0)
    path = tmp_path / "run" / "metrics.csv"
    logger.log_metrics(train_record(1, 0.1234567890123456), 12)
    first_inode = os.stat(path).st_ino
    logger.log_metrics(val_record(1, np.float64(0.5)), 12)  # new columns: rewrite
    assert os.stat(path).st_ino != first_inode, "a new column must replace the file"
    second_inode = os.stat(path).st_ino
    logger.log_metrics({"epoch": 2, "train_loss": 1 / 3, "train_num_samples": np.int64(1437)}, 24)
    logger.log_metrics({"val_loss": 0.25}, 30)  # no epoch: empty cell
    assert os.stat(path).st_ino == second_inode, "known columns must append"
    logger.finalize()
    assert read_csv(path) == [
        ["step", "epoch", "train_loss", "train_num_samples", "val_loss", "val_accuracy"],
        ["12", "1", "0.1234567890123456", "1437", "", ""],
        ["12", "1", "", "", "0.5", "0.9"],
        ["24", "2", repr(1 / 3), "1437", "", ""],
        ["30", "", "", "", "0.25", ""]]
    assert float(read_csv(path)[3][2]) == 1 / 3  # full precision
    assert os.listdir(tmp_path / "run") == ["metrics.csv"]  # no temporary files left


def test_csv_resume_drops_rows_after_the_resumed_step(tmp_path):
    path = str(tmp_path / "m.csv")
    first = CSVLogger(path)
    first.setup(None, 0)
    for epoch, step in ((1, 10), (2, 20), (3, 30)):
        first.log_metrics(train_record(epoch, 1.0 / epoch), step)
    first.log_metrics(val_record(3, 0.7), 30)
    first.finalize()

    resumed = CSVLogger(path)
    resumed.setup(None, 20)
    rows = read_csv(path)
    assert rows[0] == ["step", "epoch", "train_loss", "train_num_samples", "val_loss",
                       "val_accuracy"]  # columns of the interrupted run kept
    assert [r[0] for r in rows[1:]] == ["10", "20"]
    resumed.log_metrics(train_record(3, 0.3), 30)
    resumed.log_metrics({"epoch": 3, "lr": 0.01}, 30)
    resumed.finalize()
    rows = read_csv(path)
    assert rows[0][-1] == "lr" and [r[0] for r in rows[1:]] == ["10", "20", "30", "30"]
    assert rows[3][2] == "0.3" and rows[4][-1] == "0.01"


def test_csv_fresh_run_over_an_old_file_keeps_only_step_zero(tmp_path):
    path = str(tmp_path / "m.csv")
    with open(path, "w") as f:
        f.write("step,epoch,train_loss\n0,0,9.0\n5,1,1.0\n7,1,0.5")  # last row: no newline
    logger = CSVLogger(path)
    logger.setup(None, 0)
    logger.log_metrics({"epoch": 1, "train_loss": 2.0}, 5)
    logger.finalize()
    assert read_csv(path) == [["step", "epoch", "train_loss"], ["0", "0", "9.0"],
                              ["5", "1", "2.0"]]


def test_csv_bad_setup(tmp_path):
    with pytest.raises(ConfigError, match="CSVLogger needs a path, or TorchTrainer"):
        CSVLogger().setup(None, 0)
    foreign = tmp_path / "data.csv"
    foreign.write_text("name,value\na,1\n")
    with pytest.raises(ConfigError, match="not a raysgd metrics file"):
        CSVLogger(str(foreign)).setup(None, 0)
    assert foreign.read_text() == "name,value\na,1\n"  # left alone


# ---------------------------------------------------------------- TensorBoard
def tb_events(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return events


def scalars(events, tag):
    return [(e.step, round(e.value, 5)) for e in events.Scalars(tag)]


def test_tensorboard_scalars_and_config(tmp_path):
    logger = TensorBoardLogger()
    logger.setup(str(tmp_path), 0)
    logger.log_hyperparams(CONFIG)
    logger.log_metrics({**train_record(1, 0.5), "flag": True, "name": "x"}, 12)
    logger.log_metrics(val_record(1, 0.75), 12)
    logger.log_metrics(train_record(2, 0.25), 24)
    logger.finalize()
    events = tb_events(tmp_path / "tensorboard")
    assert scalars(events, "train_loss") == [(12, 0.5), (24, 0.25)]
    assert scalars(events, "val_loss") == [(12, 0.75)]
    assert scalars(events, "epoch") == [(12, 1.0), (12, 1.0), (24, 2.0)]
    assert "flag" not in events.Tags()["scalars"] and "name" not in events.Tags()["scalars"]
    text = events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| model/hidden | 64 |" in text and "| model/act | torch.relu |" in text


def test_tensorboard_resume_hides_the_interrupted_runs_later_steps(tmp_path):
    first = TensorBoardLogger(str(tmp_path / "tb"))
    first.setup(None, 0)
    for step in range(1, 11):
        first.log_metrics({"train_loss": float(step)}, step)
    first.finalize()
    resumed = TensorBoardLogger(str(tmp_path / "tb"))
    resumed.setup(None, 5)
    for step in (6, 7):
        resumed.log_metrics({"train_loss": 100.0 + step}, step)
    resumed.finalize()
    assert scalars(tb_events(tmp_path / "tb"), "train_loss") == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (6, 106.0), (7, 107.0)]


def test_tensorboard_needs_a_directory():
    with pytest.raises(ConfigError, match="TensorBoardLogger needs a log_dir"):
        TensorBoardLogger().setup(None, 0)


# ---------------------------------------------------------------- MLflow
def test_mlflow_file_store_metrics_params_and_status(tmp_path, file_store_env):
    from mlflow.tracking import MlflowClient

    logger = MLflowLogger(run_name="first", tags={"team": "ml"})
    logger.setup(str(tmp_path), 0)
    run_id = logger.run_id
    assert logger.tracking_uri == "file:" + str(tmp_path / "mlruns")
    logger.log_hyperparams(CONFIG)
    logger.log_metrics({**train_record(1, 0.5), "flag": True}, 12)
    logger.log_metrics(val_record(1, 0.75), 12)
    logger.log_metrics({"train_loss": 0.25, "top@1 acc": 0.5}, 24)
    logger.finalize()

    client = MlflowClient(logger.tracking_uri)
    history = client.get_metric_history(run_id, "train_loss")
    assert sorted((m.step, m.value) for m in history) == [(12, 0.5), (24, 0.25)]
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "top_1 acc")] == [
        (24, 0.5)]
    run = client.get_run(run_id)
    assert run.data.params == {"lr": "0.1", "model/hidden": "64", "model/act": "torch.relu",
                               "layers": "[64, 32]"}
    assert "flag" not in run.data.metrics and run.data.metrics["val_accuracy"] == 0.9
    assert run.info.status == "FINISHED" and run.info.run_name == "first"
    assert run.data.tags["team"] == "ml"

    second = MLflowLogger(tracking_uri=logger.tracking_uri)  # same experiment, new run
    second.setup(None, 24)
    second.finalize()
    assert second.run_id != run_id
    assert client.get_run(second.run_id).info.experiment_id == run.info.experiment_id
    assert client.get_run(second.run_id).data.tags["raysgd.resumed_step"] == "24"


def test_mlflow_unusable_tracking_uri_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot use the tracking URI 'nosuch://x'"):
        MLflowLogger(tracking_uri="nosuch://x").setup(None, 0)


def test_mlflow_key_makes_names_mlflow_accepts():
    assert mlflow_key("val/top@1 acc") == "val/top_1 acc"
    assert mlflow_key("/a//../b") == "a/__/b"
    assert len(mlflow_key("k" * 300)) == 250


# ---------------------------------------------------------------- Weights & Biases
def wandb_files(directory):
    return glob.glob(os.path.join(str(directory), "wandb", "offline-run-*", "run-*.wandb"))


def wandb_bytes(path, *needles, timeout_s=10.0):
    """The .wandb file once it holds every needle (or the deadline passed):
    wandb 0.31's run.finish() can return a few ms before its separate core
    process has written the file."""
    deadline = time.monotonic() + timeout_s
    while True:
        with open(path, "rb") as f:
            data = f.read()
        if all(n in data for n in needles) or time.monotonic() > deadline:
            return data
        time.sleep(0.02)


def test_wandb_offline_run_is_written(tmp_path, quiet_wandb):
    import wandb

    logger = WandbLogger(mode="offline", name="first")
    other = WandbLogger(mode="offline", dir=str(tmp_path / "other"))
    logger.setup(str(tmp_path / "run"), 0)
    other.setup(None, 0)  # two runs at once in one process
    assert wandb.run is None, "the global run must stay the user's"
    logger.log_hyperparams(CONFIG)
    for step, record in ((12, train_record(1, 0.5)), (12, val_record(1, 0.7)),
                         (24, train_record(2, 0.25)), (12, train_record(2, 0.3))):
        logger.log_metrics(record, step)
    other.log_metrics({"other_metric": 1.0}, 1)
    logger.finalize()
    other.finalize()
    assert logger.run is None
    [path] = wandb_files(tmp_path / "run")
    [other_path] = wandb_files(tmp_path / "other")
    needles = (b"train_loss", b"val_accuracy", b"global_step", b"model/hidden", b"first")
    data = wandb_bytes(path, *needles)
    for needle in needles:
        assert needle in data, needle
    assert b"other_metric" not in data
    assert b"other_metric" in wandb_bytes(other_path, b"other_metric")


def test_wandb_online_without_an_api_key_is_a_config_error(tmp_path, monkeypatch, quiet_wandb):
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="mode='offline'"):
        WandbLogger(mode="online").setup(str(tmp_path), 0)


def test_wandb_steps_never_go_back():
    steps = StepMap()
    assert [steps.wandb_step(s) for s in (5, 5, 10, 3, 3, 6, 20)] == [5, 5, 10, 11, 11, 14, 28]
    resumed_run = StepMap(first=101)  # a W&B run resumed through init_kwargs
    assert [resumed_run.wandb_step(s) for s in (100, 100, 110)] == [101, 101, 111]


# ---------------------------------------------------------------- LoggerHub
class Recorder(Logger):
    def __init__(self, fail_on=None, error=RuntimeError("tracker down")):
        self.calls, self.threads = [], set()
        self.fail_on, self.error = fail_on, error

    def _record(self, *call):
        self.threads.add(threading.current_thread().name)
        self.calls.append(call)
        if call[0] == self.fail_on:
            raise self.error

    def setup(self, run_dir, resumed_step):
        self._record("setup", run_dir, resumed_step)

    def log_hyperparams(self, config):
        self._record("log_hyperparams", config)

    def log_metrics(self, metrics, step):
        self._record("log_metrics", metrics, step)

    def finalize(self):
        self._record("finalize")


class DuckLogger:
    def __init__(self):
        self.metrics = []

    def log_metrics(self, metrics, step):
        self.metrics.append((step, metrics))

    def log_hyperparams(self, config):
        pass

    def finalize(self):
        pass


def logger_threads():
    return [t for t in threading.enumerate() if t.name == "raysgd-loggers"]


def test_hub_runs_calls_in_order_off_thread_on_copies():
    good, duck = Recorder(), DuckLogger()
    hub = LoggerHub([good, duck])
    hub.setup("/runs/x", 7)
    config = {"model": {"hidden": 64}}
    hub.log_hyperparams(config)
    metrics = {"epoch": 1, "train_loss": 0.5}
    hub.log_metrics(metrics, 12)
    metrics["train_loss"] = 99.0
    config["model"]["hidden"] = 1
    hub.log_metrics({"val_loss": 0.7}, 12)
    assert hub.flush() is True
    assert good.calls == [("setup", "/runs/x", 7), ("log_hyperparams", {"model": {"hidden": 64}}),
                          ("log_metrics", {"epoch": 1, "train_loss": 0.5}, 12),
                          ("log_metrics", {"val_loss": 0.7}, 12)]
    assert good.threads == {threading.current_thread().name, "raysgd-loggers"}
    assert duck.metrics == [(12, {"epoch": 1, "train_loss": 0.5}), (12, {"val_loss": 0.7})]
    hub.close()
    hub.close()
    hub.log_metrics({"train_loss": 0.1}, 24)  # ignored after close
    assert hub.flush() is True
    assert good.calls[-1] == ("finalize",) and len(good.calls) == 5
    assert not logger_threads()


def test_hub_disables_a_failing_logger_after_one_warning(caplog):
    broken, good = Recorder(fail_on="log_metrics", error=OSError("disk full")), Recorder()
    hub = LoggerHub([broken, good])
    hub.setup(None, 0)
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        for step in (1, 2, 3):
            hub.log_metrics({"train_loss": 1.0}, step)  # never raises
        assert hub.flush()
        hub.close()
    warnings = [r.getMessage() for r in caplog.records if r.name == "raysgd"]
    assert len(warnings) == 1
    assert "Recorder.log_metrics" in warnings[0] and "OSError: disk full" in warnings[0]
    assert hub.loggers == [good]
    assert [(lg, type(e)) for lg, e in hub.disabled] == [(broken, OSError)]
    assert [c[0] for c in broken.calls] == ["setup", "log_metrics", "finalize"]
    assert [c[2] for c in good.calls if c[0] == "log_metrics"] == [1, 2, 3]
    assert good.calls[-1] == ("finalize",)


def test_hub_setup_errors():
    early, bad = Recorder(), Recorder(fail_on="setup", error=ConfigError("bad path"))
    hub = LoggerHub([early, bad])
    with pytest.raises(ConfigError, match="bad path"):
        hub.setup(None, 0)
    assert early.calls[-1] == ("finalize",), "loggers already set up are closed again"
    hub.log_metrics({"a": 1.0}, 1)
    hub.close()
    assert not logger_threads()

    crashing, good = Recorder(fail_on="setup", error=KeyError("x")), Recorder()
    hub = LoggerHub([crashing, good])
    hub.setup(None, 0)  # not a ConfigError: disabled, not raised
    assert hub.loggers == [good] and isinstance(hub.disabled[0][1], KeyError)
    with pytest.raises(RuntimeError, match="already called"):
        hub.setup(None, 0)
    hub.close()


def test_hub_rejects_what_is_not_a_logger():
    with pytest.raises(ConfigError, match=r"loggers=\[CSVLogger\] got the class; "
                                          r"pass an instance: CSVLogger\(\)"):
        LoggerHub([CSVLogger])
    with pytest.raises(ConfigError, match=r"loggers\[1\] is 'csv' of type str.*"
                                          "log_metrics, log_hyperparams, finalize"):
        LoggerHub([CSVLogger(), "csv"])
    with pytest.raises(ConfigError, match=r"must be a list of loggers"):
        LoggerHub(CSVLogger())

    class NoMetrics(Logger):
        pass

    with pytest.raises(ConfigError, match="NoMetrics does not override log_metrics"):
        LoggerHub([NoMetrics()])


def test_hub_without_loggers_does_nothing():
    for hub in (LoggerHub(None), LoggerHub([])):
        hub.setup(None, 0)
        hub.log_hyperparams({"lr": 0.1})
        hub.log_metrics({"a": 1.0}, 1)
        assert hub.flush() and hub.loggers == []
        hub.close()
    assert not logger_threads()


def test_hub_close_gives_up_on_a_hanging_logger(caplog):
    release = threading.Event()

    class Hanging(Recorder):
        def log_metrics(self, metrics, step):
            release.wait(30)

    hub = LoggerHub([Hanging()])
    hub.setup(None, 0)
    hub.log_metrics({"a": 1.0}, 1)
    assert hub.flush(timeout_s=0.1) is False
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="raysgd"):
        hub.close(timeout_s=0.2)
    assert time.monotonic() - started < 5
    assert "did not finish within" in caplog.text
    release.set()
    for thread in logger_threads():
        thread.join(5)


# ---------------------------------------------------------------- together
def test_hub_with_every_logger_writes_every_record(tmp_path, quiet_wandb, file_store_env):
    from mlflow.tracking import MlflowClient

    mlflow_logger = MLflowLogger()
    hub = LoggerHub([CSVLogger(), TensorBoardLogger(), mlflow_logger,
                     WandbLogger(mode="offline")])
    hub.setup(str(tmp_path), 0)
    hub.log_hyperparams(CONFIG)
    for epoch in (1, 2):
        hub.log_metrics(train_record(epoch, 1.0 / epoch), 12 * epoch)
        hub.log_metrics(val_record(epoch, 2.0 / epoch), 12 * epoch)
    hub.close()
    assert hub.disabled == [] and len(hub.loggers) == 4
    assert [r[:3] for r in read_csv(tmp_path / "metrics.csv")[1:]] == [
        ["12", "1", "1.0"], ["12", "1", ""], ["24", "2", "0.5"], ["24", "2", ""]]
    assert scalars(tb_events(tmp_path / "tensorboard"), "val_loss") == [(12, 2.0), (24, 1.0)]
    client = MlflowClient(mlflow_logger.tracking_uri)
    history = client.get_metric_history(mlflow_logger.run_id, "val_loss")
    assert sorted((m.step, m.value) for m in history) == [(12, 2.0), (24, 1.0)]
    assert client.get_run(mlflow_logger.run_id).data.params["model/hidden"] == "64"
    [wandb_file] = wandb_files(tmp_path)
    assert b"val_accuracy" in wandb_bytes(wandb_file, b"val_accuracy")


def _python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (module imports and exit hooks are per process)."""
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_importing_loggers_imports_no_tracker():
    code = ("import sys, raysgd.loggers\n"
            "loaded = [m for m in ('mlflow', 'wandb', 'tensorboard', 'torch.utils.tensorboard')"
            " if m in sys.modules]\n"
            "assert not loaded, loaded\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr


def test_a_hub_never_closed_is_closed_at_exit():
    code = ("from raysgd.loggers import Logger, LoggerHub\n"
            "class Printer(Logger):\n"
            "    def log_metrics(self, metrics, step):\n"
            "        print('step', step, flush=True)\n"
            "    def finalize(self):\n"
            "        print('finalized', flush=True)\n"
            "hub = LoggerHub([Printer()])\n"
            "hub.setup(None, 0)\n"
            "hub.log_metrics({'a': 1.0}, 3)\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:2] == ["step 3", "finalized"]
