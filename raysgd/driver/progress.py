"""Progress bars of train/validate calls, drawn on the driver from the counters the
workers keep (:class:`raysgd.worker.progress.BatchEvents`) and the health polls carry back.

:func:`make_progress` turns the ``use_tqdm`` setting into a factory once:
:class:`ProgressBar` (a tqdm bar per call, fed by rank 0's counts and every rank's
samples) or :data:`NULL_PROGRESS`. Nothing downstream tests the flag again.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, Mapping, Optional, TextIO

from raysgd.errors import ConfigError
from raysgd.worker.progress import is_number

MAX_SHOWN_METRICS = 3


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
                  and k not in ("epoch", "batch_count", "num_samples") and is_number(metrics[k])]
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
