"""Progress of a train/validate call: counted on the workers, drawn on the driver.

Worker side, :class:`BatchEvents`: the runner opens a call with its length,
the loops count each batch (and the default loops its metrics and samples).
The driver's health poll, which already asks every rank for a progress
report four times a second, carries the counters back; nothing is ever
printed by a worker, so Ray's log forwarding cannot garble a bar.

Driver side, :func:`make_progress` turns the ``use_tqdm`` setting into a
factory once: :class:`ProgressBar` (a tqdm bar per call, fed by rank 0's
counts and every rank's samples) or :data:`NULL_PROGRESS`. Nothing
downstream tests the flag again.
"""
from __future__ import annotations

import numbers
import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional, TextIO

from raysgd.errors import ConfigError

MAX_SHOWN_METRICS = 3


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

    def fetched_batch(self) -> None:
        self.fetched += 1

    def finished_batch(self, metrics: Mapping[str, Any], num_samples: int) -> None:
        # One assignment, so a report taken meanwhile sees old or new, never half.
        self.metrics = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        self.samples += int(num_samples)
        self.finished += 1

    def report(self) -> Dict[str, Any]:
        # A loop that does not report finished batches (an overridden train_epoch)
        # still shows batches fetched, less the one in flight.
        done = self.finished if self.finished > self._base else max(self.fetched - 1, self._base)
        return {"kind": self.kind, "done": done, "total": self.total,
                "samples": self.samples, "metrics": self.metrics}


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_use_tqdm(value: Any) -> None:
    if value is not True and value is not False and value != "always":
        raise ConfigError(
            f"use_tqdm must be False, True (a bar when the driver's output is interactive) or "
            f"'always' (a bar even in logs and pipes), got {value!r}.")


def interactive(stream: TextIO) -> bool:
    """A terminal or a notebook: somewhere a redrawn bar reads well."""
    if "ipykernel" in sys.modules:
        return True
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class _NullProgress:
    """The bar when progress is off: every call is a no-op."""

    def update(self, reports: Mapping[int, Mapping[str, Any]]) -> None:
        pass

    def close(self, result: Optional[Mapping[str, Any]] = None,
              done: Optional[int] = None) -> None:
        pass


NULL_PROGRESS = _NullProgress()


class ProgressBar:
    """One tqdm bar for one call: rank 0's batches, all ranks' samples per second."""

    def __init__(self, desc: str, file: Optional[TextIO] = None,
                 clock: Callable[[], float] = time.monotonic):
        from tqdm import tqdm

        self._bar = tqdm(desc=desc, total=None, unit="batch", file=file or sys.stderr,
                         dynamic_ncols=True, leave=True, mininterval=0.2)
        self._clock = clock
        self._start = clock()

    def update(self, reports: Mapping[int, Mapping[str, Any]]) -> None:
        """Show the latest reports (rank -> report); rank 0 leads the count."""
        lead = reports.get(0)
        if not lead or "call" not in lead:
            return
        call = lead["call"]
        if call["total"] is not None and self._bar.total != call["total"]:
            self._bar.total = call["total"]
        if call["done"] != self._bar.n:
            self._bar.update(call["done"] - self._bar.n)
        samples = sum(r["call"]["samples"] for r in reports.values() if "call" in r)
        self._bar.set_postfix(self._postfix(call["metrics"], samples), refresh=False)

    def close(self, result: Optional[Mapping[str, Any]] = None,
              done: Optional[int] = None) -> None:
        """Finish the bar; a completed call shows its ``done`` batches (rank 0's)
        and its averaged metrics, a failed one stays where it stopped."""
        if result is not None:
            # A call shorter than one poll ends before its length was reported.
            if done is not None:
                self._bar.total = max(self._bar.total or 0, done)
                self._bar.update(done - self._bar.n)
            samples = result.get("num_samples", 0)
            self._bar.set_postfix(self._postfix(result, samples), refresh=False)
        self._bar.close()

    def _postfix(self, metrics: Mapping[str, Any], samples: float) -> Dict[str, str]:
        shown = [k for k in metrics if "loss" in k and not k.startswith("last_")]
        shown += [k for k in metrics if k not in shown and not k.startswith("last_")
                  and k not in ("epoch", "batch_count", "num_samples") and _is_number(metrics[k])]
        postfix = {k: f"{metrics[k]:.4g}" for k in shown[:MAX_SHOWN_METRICS]}
        elapsed = self._clock() - self._start
        if samples and elapsed > 0:
            postfix["samples/s"] = f"{samples / elapsed:.0f}"
        return postfix


ProgressFactory = Callable[[str], Any]


def make_progress(use_tqdm: Any, file: Optional[TextIO] = None) -> ProgressFactory:
    """``use_tqdm`` as a factory of per-call bars (``factory("train")``)."""
    check_use_tqdm(use_tqdm)
    stream = file or sys.stderr
    if use_tqdm is False or (use_tqdm is True and not interactive(stream)):
        return lambda desc: NULL_PROGRESS
    return lambda desc: ProgressBar(desc, file=file)
