"""Pure bookkeeping for hang detection on the driver; no Ray.

The worker group feeds it each rank's progress report; it says which ranks
stalled.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional

from raysgd.errors import RankFailure, WorkerFailedError


class WorkerHangError(WorkerFailedError):
    """Ranks made no progress (or did not answer) within ``timeout_s``."""


class HealthMonitor:
    """Tracks the latest progress report of every rank during one call."""

    def __init__(self, world_size: int, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic):
        self.world_size = world_size
        self.timeout_s = timeout_s
        self.clock = clock
        self.start_call()

    def start_call(self) -> None:
        now = self.clock()
        self.reports: Dict[int, Dict[str, Any]] = {}
        self._answered = {rank: now for rank in range(self.world_size)}
        self._asked: Dict[int, float] = {}

    def asked(self, rank: int) -> None:
        self._asked.setdefault(rank, self.clock())

    def observe(self, rank: int, report: Dict[str, Any]) -> None:
        self.reports[rank] = report
        self._answered[rank] = self.clock()
        self._asked.pop(rank, None)

    def late(self, after_s: float) -> List[int]:
        """Ranks asked for a report more than ``after_s`` ago that have not answered."""
        now = self.clock()
        return sorted(rank for rank, asked in self._asked.items() if now - asked > after_s)

    def last_seen(self, ranks: List[int]) -> Optional[float]:
        """Wall time the first of ``ranks`` last answered (or the call started), or None."""
        answered = [self._answered[rank] for rank in ranks if rank in self._answered]
        if not answered:
            return None
        return time.time() - (self.clock() - min(answered))

    def stalled(self) -> List[RankFailure]:
        """Ranks idle longer than ``timeout_s``, or whose health check went unanswered; once
        one is, also every rank idle for over half of ``timeout_s``. A hung rank holds the
        others up in their next collective moments later, and which of them crosses the
        timeout first is a race (the hung one may have started its step last), so the
        error names every rank stuck with it and where each is."""
        now, out, idle = self.clock(), [], {}
        for rank in range(self.world_size):
            report = self.reports.get(rank)
            asked = self._asked.get(rank)
            if asked is not None and now - asked > self.timeout_s:
                out.append(RankFailure(rank, TimeoutError(
                    f"health check unanswered for {now - asked:.1f}s")))
            elif report is not None and report["idle_s"] > self.timeout_s / 2:
                idle[rank] = report
        if out or any(report["idle_s"] > self.timeout_s for report in idle.values()):
            out += [RankFailure(rank, TimeoutError(
                f"no progress for {report['idle_s']:.1f}s (timeout_s={self.timeout_s:g}); "
                f"at {report.get('where', '?')}")) for rank, report in idle.items()]
        return sorted(out, key=lambda failure: failure.rank)

    def hang_error(self) -> Optional[WorkerHangError]:
        stalled = self.stalled()
        if not stalled:
            return None
        return WorkerHangError("Worker(s) hung: no progress within timeout_s.", stalled)
