"""Optional profiling timers for operator hooks.

``profile=False`` swaps in :data:`NULL_TIMERS`, whose ``record`` returns one
shared no-op context, so timing code in the hot loop costs a dict-free call.
"""
from __future__ import annotations

import contextlib
import time
from typing import Dict


class _Timer:
    __slots__ = ("total", "count", "_start")

    def __init__(self):
        self.total = 0.0
        self.count = 0
        self._start = 0.0

    def __enter__(self):
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.total += time.perf_counter() - self._start
        self.count += 1
        return False


class TimerCollection:
    """Named timers: ``with timers.record("fwd"): ...``; ``stats()`` gives means."""

    enabled = True

    def __init__(self):
        self._timers: Dict[str, _Timer] = {}

    def record(self, name: str) -> _Timer:
        timer = self._timers.get(name)
        if timer is None:
            timer = self._timers[name] = _Timer()
        return timer

    def stats(self, mean: bool = True) -> Dict[str, float]:
        out = {}
        for name, timer in self._timers.items():
            if mean:
                out[f"mean_{name}_s"] = timer.total / max(timer.count, 1)
            else:
                out[f"{name}_s"] = timer.total
        return out


class _NullTimerCollection:
    enabled = False
    _context = contextlib.nullcontext()

    def record(self, name: str):
        return self._context

    def stats(self, mean: bool = True) -> Dict[str, float]:
        return {}


NULL_TIMERS = _NullTimerCollection()
