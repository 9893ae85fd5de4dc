"""Metrics and config as an MLflow run.

Talks to the tracking store through its own ``MlflowClient``, never through
``mlflow.start_run``/``mlflow.log_metric``: the user's active run (and the
fluent API's global state) stay untouched. mlflow is imported in ``setup``.
"""
from __future__ import annotations

import os
import re
import time
import urllib.parse
from typing import Any, Dict, List, Optional

from raysgd.errors import ConfigError
from raysgd.loggers.base import Logger, flatten_config, is_number

# MLflow's own limits (mlflow.utils.validation): bigger batches are refused.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_PER_BATCH = 100
MAX_KEY_CHARS = 250
MAX_PARAM_CHARS = 6000


class MLflowLogger(Logger):
    """One MLflow run per trainer, in experiment ``experiment_name``.

    ``tracking_uri`` None: ``<checkpoint_dir>/mlruns`` when the trainer has a
    checkpoint_dir, else MLflow's default (``MLFLOW_TRACKING_URI``).
    """

    def __init__(self, tracking_uri: Optional[str] = None, experiment_name: str = "raysgd",
                 run_name: Optional[str] = None, tags: Optional[Dict[str, str]] = None) -> None:
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tags = dict(tags or {})
        self.client: Any = None
        self.run_id: Optional[str] = None  # kept after finalize, to read the run back
        self._finished = False

    def setup(self, run_dir: Optional[str], resumed_step: int) -> None:
        try:
            from mlflow.tracking import MlflowClient, get_tracking_uri
        except ImportError as exc:
            raise ConfigError("MLflowLogger needs mlflow: pip install mlflow-skinny") from exc
        uri = self.tracking_uri
        if uri is None and run_dir is not None:
            uri = "file:" + os.path.abspath(os.path.join(run_dir, "mlruns"))
        if uri is None:
            uri = get_tracking_uri()  # MLFLOW_TRACKING_URI, else MLflow's default
        if _is_file_store(uri):
            # MLflow 3 refuses its file store unless this is set (it wants a
            # database now). A file store is what a checkpoint_dir gives and
            # what the user asked for when passing a path, so opt in; setdefault
            # leaves an explicit MLFLOW_ALLOW_FILE_STORE=false in force.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            self.client = MlflowClient(uri)
        except Exception as exc:  # an unknown scheme, or a store mlflow-skinny lacks
            raise ConfigError(
                f"MLflowLogger cannot use the tracking URI {uri!r}: {exc}\nPass "
                "MLflowLogger(tracking_uri=...) a server URL or 'file:/path/to/mlruns', or give "
                "TorchTrainer a checkpoint_dir to log to <checkpoint_dir>/mlruns") from exc
        self.tracking_uri = uri
        tags = dict(self.tags)
        if resumed_step > 0:
            tags.setdefault("raysgd.resumed_step", str(resumed_step))
        run = self.client.create_run(self._experiment_id(), run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id

    def log_hyperparams(self, config: Dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [Param(mlflow_key(k), str(v)[:MAX_PARAM_CHARS])
                  for k, v in flatten_config(config).items()]
        for batch in _chunks(params, MAX_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=batch)

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        batch = [Metric(mlflow_key(k), float(v), now_ms, int(step))
                 for k, v in metrics.items() if is_number(v)]
        for chunk in _chunks(batch, MAX_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=chunk)

    def finalize(self) -> None:
        if self.run_id is not None and not self._finished:
            self._finished = True
            self.client.set_terminated(self.run_id)

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            try:
                return self.client.create_experiment(self.experiment_name)
            except MlflowException:  # another process created it just now
                experiment = self.client.get_experiment_by_name(self.experiment_name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage == "deleted":
            raise ConfigError(
                f"MLflow experiment {self.experiment_name!r} at {self.tracking_uri} is deleted; "
                "restore it (mlflow experiments restore) or pass another experiment_name")
        return experiment.experiment_id


def mlflow_key(key: str) -> str:
    """``key`` as a name MLflow accepts: letters, digits, ``_-. /`` only, no
    empty or leading ``/`` path parts (other characters become ``_``)."""
    text = re.sub(r"[^\w.\- /]", "_", str(key))
    parts = [p if p not in (".", "..") else p.replace(".", "_") for p in text.split("/") if p]
    return ("/".join(parts) or "_")[:MAX_KEY_CHARS]


def _is_file_store(uri: str) -> bool:
    scheme = urllib.parse.urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1  # len 1: a Windows drive letter


def _chunks(items: List[Any], size: int) -> List[List[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]
