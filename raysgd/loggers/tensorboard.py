"""Metrics as TensorBoard scalars, the config as a text table.

Uses PyTorch's ``SummaryWriter``, imported in ``setup`` so that importing
raysgd never needs (or pays for) the tensorboard package.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from raysgd.errors import ConfigError
from raysgd.loggers.base import Logger, flatten_config, is_number, path_in_run


class TensorBoardLogger(Logger):
    """Writes event files to ``log_dir`` (default: ``<checkpoint_dir>/tensorboard``)."""

    def __init__(self, log_dir: Optional[str] = None) -> None:
        self.log_dir = log_dir
        self.writer: Any = None

    def setup(self, run_dir: Optional[str], resumed_step: int) -> None:
        self.log_dir = path_in_run(self.log_dir, run_dir, "tensorboard",
                                   "TensorBoardLogger needs a log_dir")
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError("TensorBoardLogger needs the tensorboard package: "
                              "pip install tensorboard") from exc
        # TensorBoard hides the events of earlier files at steps >= purge_step:
        # what the interrupted run logged after the checkpoint we resumed from
        # is redone now and must not show twice. A fresh run in a reused
        # directory (resumed_step 0) hides the earlier run's events the same way,
        # as the CSV drops its rows.
        self.writer = SummaryWriter(log_dir=self.log_dir, purge_step=resumed_step + 1)

    def log_hyperparams(self, config: Dict[str, Any]) -> None:
        self.writer.add_text("config", config_table(config))
        self.writer.flush()

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            if is_number(value):
                self.writer.add_scalar(key, float(value), global_step=step)
        # One flush per train()/validate() is cheap, and the writer's own
        # flush interval (2 minutes) would lose the tail of a crashed run.
        self.writer.flush()

    def finalize(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


def config_table(config: Dict[str, Any]) -> str:
    """The flattened config as a markdown table (TensorBoard renders markdown)."""
    lines = ["| key | value |", "|---|---|"]
    for key, value in flatten_config(config).items():
        lines.append(f"| {_escape(str(key))} | {_escape(str(value))} |")
    return "\n".join(lines)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
