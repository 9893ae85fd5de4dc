"""Timers for profiling operator hooks (``ray.util.sgd.utils``' ``TimerStat``/``TimerCollection``).

``profile=False`` swaps in :data:`NULL_TIMERS`, whose ``record`` returns one
shared no-op context, so timing code in the hot loop costs a dict-free call.
"""
from __future__ import annotations

import collections
import contextlib
import statistics
import time
from typing import Deque, Dict, Optional


class TimerStat:
    """Times a block (``with timer: ...``); statistics over the last ``window_size`` samples.

    ``window_size=None`` makes ``mean`` and ``sum`` cover every sample ever
    pushed without storing them (the runner's profile of a long epoch); the
    sample-based statistics (``median``, ``max``, ``first``) then see the last one.
    Not thread-safe.
    """

    def __init__(self, window_size: Optional[int] = 10):
        self._window_size = window_size
        self._samples: Deque[float] = collections.deque(maxlen=window_size or 1)
        self._units: Deque[float] = collections.deque(maxlen=window_size or 1)
        self._start: Optional[float] = None
        self._total_time = 0.0
        self.count = 0

    def __enter__(self):
        if self._start is not None:
            raise RuntimeError("TimerStat does not support nested or concurrent use.")
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.push(time.perf_counter() - self._start)
        self._start = None
        return False

    def push(self, time_delta: float) -> None:
        self._samples.append(time_delta)
        self.count += 1
        self._total_time += time_delta

    def push_units_processed(self, n: float) -> None:
        self._units.append(n)

    @property
    def mean(self) -> float:
        if self._window_size is None:
            return self._total_time / self.count if self.count else float("nan")
        return statistics.fmean(self._samples) if self._samples else float("nan")

    @property
    def sum(self) -> float:
        return self._total_time if self._window_size is None else float(sum(self._samples))

    @property
    def median(self) -> float:
        return statistics.median(self._samples) if self._samples else float("nan")

    @property
    def max(self) -> float:
        return max(self._samples) if self._samples else float("nan")

    @property
    def first(self) -> Optional[float]:
        return self._samples[0] if self._samples else None

    @property
    def last(self) -> Optional[float]:
        return self._samples[-1] if self._samples else None

    @property
    def size(self) -> int:
        return len(self._samples)

    @property
    def mean_units_processed(self) -> float:
        return statistics.fmean(self._units) if self._units else float("nan")

    @property
    def mean_throughput(self) -> float:
        elapsed = sum(self._samples)
        return sum(self._units) / elapsed if elapsed else 0.0

    def reset(self) -> None:
        self._samples.clear()
        self._units.clear()
        self._start = None
        self._total_time = 0.0
        self.count = 0


class TimerCollection:
    """Named timers: ``with timers.record("fwd"): ...``; ``stats()`` gives ``mean_<name>_s``.

    ``disable()`` makes ``record`` a no-op (as legacy's did); ``window_size``
    is passed to every :class:`TimerStat`.
    """

    def __init__(self, window_size: Optional[int] = 10):
        self._window_size = window_size
        self._timers: Dict[str, TimerStat] = {}
        self.enabled = True

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    def reset(self) -> None:
        for timer in self._timers.values():
            timer.reset()

    def record(self, key: str):
        if not self.enabled:
            return _NULL_CONTEXT
        timer = self._timers.get(key)
        if timer is None:
            timer = self._timers[key] = TimerStat(self._window_size)
        return timer

    def stats(self, mean: bool = True, last: bool = False) -> Dict[str, float]:
        out = {}
        for key, timer in self._timers.items():
            if timer.count:
                if mean:
                    out[f"mean_{key}_s"] = timer.mean
                if last:
                    out[f"last_{key}_s"] = timer.last
        return out


_NULL_CONTEXT = contextlib.nullcontext()


class _NullTimerCollection:
    enabled = False

    def record(self, key: str):
        return _NULL_CONTEXT

    def stats(self, mean: bool = True, last: bool = False) -> Dict[str, float]:
        return {}


NULL_TIMERS = _NullTimerCollection()
