"""Metrics as a CSV table: one row per record, one column per metric.

Format (``raysgd.plot`` reads it): a header row; then ``step`` and ``epoch``,
then the other metric keys in the order they first appeared. A missing value
is an empty cell; ints are written as ints, floats with ``repr`` (full
precision). The file is always whole: a new column rewrites it through a
temporary file and ``os.replace``, and every appended row is flushed.
"""
from __future__ import annotations

import csv
import numbers
import os
from typing import Any, Dict, IO, List, Mapping, Optional

from raysgd.errors import ConfigError
from raysgd.loggers.base import Logger, path_in_run

FIRST_COLUMNS = ["step", "epoch"]


class CSVLogger(Logger):
    """Writes ``metrics.csv`` in the trainer's ``checkpoint_dir``, or at ``path``."""

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path
        self.columns: List[str] = list(FIRST_COLUMNS)
        self._file: Optional[IO[str]] = None

    def setup(self, run_dir: Optional[str], resumed_step: int) -> None:
        self.path = path_in_run(self.path, run_dir, "metrics.csv", "CSVLogger needs a path")
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        if os.path.exists(self.path):
            self._drop_rows_after(resumed_step)

    def log_hyperparams(self, config: Dict[str, Any]) -> None:
        """Does nothing: a config is nested and has no column shape, and a
        column per key would repeat it on every row. The other loggers
        (TensorBoard, MLflow, W&B) record it."""

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        row = {key: value for key, value in metrics.items() if key != "step"}
        row["step"] = step
        new = [key for key in row if key not in self.columns]
        if new or (self._file is None and not os.path.exists(self._path())):
            self.columns.extend(new)
            self._rewrite(self._read_rows() + [row])
            return
        if self._file is None:
            self._file = open(self._path(), "a", newline="", encoding="utf-8")
        csv.writer(self._file).writerow(self._cells(row))
        self._file.flush()

    def finalize(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _path(self) -> str:
        if self.path is None:
            raise RuntimeError("CSVLogger.log_metrics was called before setup()")
        return self.path

    def _drop_rows_after(self, resumed_step: int) -> None:
        """Keep the rows a resumed run will not log again (step <= resumed_step)."""
        with open(self._path(), newline="", encoding="utf-8") as f:
            header = next(csv.reader(f), [])
        if header and header[0] != "step":
            raise ConfigError(f"{self.path} exists and is not a raysgd metrics file (its first "
                              "column is not 'step'); pass CSVLogger(path=...) another path")
        self.columns = FIRST_COLUMNS + [c for c in header if c not in FIRST_COLUMNS]
        rows = [r for r in self._read_rows() if _step_of(r) is not None
                and _step_of(r) <= resumed_step]
        self._rewrite(rows)

    def _read_rows(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self._path()):
            return []
        with open(self._path(), newline="", encoding="utf-8") as f:
            return [dict(row) for row in csv.DictReader(f)]

    def _rewrite(self, rows: List[Mapping[str, Any]]) -> None:
        """Write the whole file to a temporary file, then swap it in (readers
        never see a half-written table, a crash never loses the old one)."""
        self.finalize()
        # Same directory, so os.replace is a rename; not mkstemp, whose 0600
        # mode would make the table unreadable to the user's other accounts.
        tmp = f"{self._path()}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(self.columns)
                writer.writerows(self._cells(row) for row in rows)
            os.replace(tmp, self._path())
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _cells(self, row: Mapping[str, Any]) -> List[str]:
        return [_cell(row.get(column)) for column in self.columns]


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value  # a cell read back from the file: already formatted
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return repr(float(value))  # float(): numpy's repr would say np.float64(...)
    return str(value)


def _step_of(row: Mapping[str, Any]) -> Optional[float]:
    try:
        return float(row.get("step") or "")
    except ValueError:
        return None  # a row cut short by a crash
