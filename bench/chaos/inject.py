"""Applies a schedule to a running trainer, on the main thread of the run's own process
(``ray.cluster_utils.Cluster`` starts and stops nodes only from the main thread), which
owns the cluster but drives no trainer (``bench.chaos.driver``)."""
from __future__ import annotations

import heapq
import itertools
import time
from typing import Any, Callable, Dict, List, Tuple

from bench.chaos.ranklog import read_rank
from bench.chaos.schedule import KILL, NODE, Event

POLL_S = 0.02


class Injector:
    """Applies each event at ``t0 + event.at_s``, or once the rank it hits has trained a step
    if that comes later (before that there is nothing to hit: the trainer is still starting).
    A preemption's second half (the node going, the process killed) runs when its notice
    ends. ``applied`` lists what happened: wall time, kind, rank, outcome, and for a
    preemption the time its node goes (``end``)."""

    def __init__(self, events: List[Event], targets: Any, t0: float, step_dir: str,
                 notice_s: float):
        self.events, self.targets, self.t0 = list(events), targets, t0
        self.step_dir, self.notice_s = step_dir, notice_s
        self.applied: List[Dict[str, Any]] = []
        self._later: List[Tuple[float, int, Callable[[], Any]]] = []
        self._order = itertools.count()

    def run_until(self, deadline: float) -> None:
        """Apply what falls due before ``deadline`` (wall time), then return."""
        while time.time() < deadline:
            while self._later and self._later[0][0] <= time.time():
                heapq.heappop(self._later)[2]()
            if self.events and self._due(self.events[0]):
                self.applied.append(self._apply(self.events.pop(0)))
            time.sleep(POLL_S)

    def _due(self, event: Event) -> bool:
        return (time.time() >= self.t0 + event.at_s
                and read_rank(self.step_dir, event.rank) is not None)

    def _apply(self, event: Event) -> Dict[str, Any]:
        started = time.time()
        try:
            if event.kind == KILL:
                outcome = self.targets.kill(event.rank)
            elif event.kind == NODE:
                outcome = self.targets.lose_node(event.rank)
            else:
                outcome, then = self.targets.preempt(event.rank, self.notice_s)
                if then is not None:
                    heapq.heappush(self._later, (started + self.notice_s, next(self._order), then))
        except Exception as exc:  # noqa: BLE001 - an event that failed to land is a miss
            outcome = f"missed: {exc!r}"
        preempt = event.kind not in (KILL, NODE)
        return {"at_s": event.at_s, "kind": event.kind, "rank": event.rank,
                "time": started, "end": started + self.notice_s if preempt else started,
                "landed": outcome.startswith("ok"), "outcome": outcome}
