"""Progress of a train/validate call, counted on a worker (drawn on the driver by
:mod:`raysgd.driver.progress`).

:class:`BatchEvents`: the runner opens a call with its length,
the loops count each batch (and the default loops its metrics and samples).
The driver's health poll, which already asks every rank for a progress
report four times a second, carries the counters back; nothing is ever
printed by a worker, so Ray's log forwarding cannot garble a bar.
"""
from __future__ import annotations

import numbers
import sys
import time
import traceback
from typing import Any, Dict, Mapping, Optional

from raysgd.worker.metrics import is_scalar_tensor

# How often the progress report reads a loss that lives on the GPU (each read waits for it).
DEVICE_READ_INTERVAL_S = 1.0


class BatchEvents:
    """The running call's counters on one rank (read from the control thread)."""

    def __init__(self) -> None:
        self.begin("idle", None)

    def begin(self, kind: str, total: Optional[int], done: int = 0) -> None:
        """A new call of ``total`` batches (None: unknown), ``done`` of them already
        done (a call resumed after a failure)."""
        self.kind, self.total = kind, total
        self.fetched = self.finished = self._base = done
        self.samples = 0
        self.metrics: Dict[str, float] = {}
        self._device_read = time.monotonic()  # a GPU loss shows from the call's 2nd second

    def fetched_batch(self) -> None:
        self.fetched += 1

    def finished_batch(self, metrics: Mapping[str, Any], num_samples: int) -> None:
        shown: Dict[str, float] = {}
        pending: Dict[str, Any] = {}  # 0-d tensors off the CPU: reading one waits for it
        for key, value in metrics.items():
            if is_number(value) or (is_scalar_tensor(value) and value.device.type == "cpu"):
                shown[key] = float(value)
            elif is_scalar_tensor(value):
                pending[key] = value
        if pending:  # a GPU loss: read it (which waits for the GPU) at most once a second
            now = time.monotonic()
            if now - self._device_read >= DEVICE_READ_INTERVAL_S:
                self._device_read = now
                shown.update((k, float(v)) for k, v in pending.items())
            else:
                shown.update((k, self.metrics[k]) for k in pending if k in self.metrics)
        # One assignment, so a report taken meanwhile sees old or new, never half.
        self.metrics = shown
        self.samples += int(num_samples)
        self.finished += 1

    def report(self) -> Dict[str, Any]:
        # A loop that does not report finished batches (an overridden train_epoch)
        # still shows batches fetched, less the one in flight.
        done = self.finished if self.finished > self._base else max(self.fetched - 1, self._base)
        return {"kind": self.kind, "done": done, "total": self.total,
                "samples": self.samples, "metrics": self.metrics}


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def thread_line(thread: Optional[int]) -> str:
    """Where the thread ``thread`` (an ident) is now: ``file:line in function``, or idle."""
    frame = sys._current_frames().get(thread) if thread else None
    if frame is None:
        return "idle"
    last = traceback.extract_stack(frame)[-1]
    return f"{last.filename}:{last.lineno} in {last.name}"
