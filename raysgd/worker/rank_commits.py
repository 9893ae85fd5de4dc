"""``RankCommits``: one rank's in-epoch commits on their way to the driver, and what they
cost the training thread. No Ray.

It puts together the hand-off queue (``raysgd.worker.handoff``), what a commit copies or
views (``raysgd.worker.live_state``, chosen once) and the time commits hold the training
thread up, which ``train(profile=True)`` reports (``commits``, ``commit_hold_s``).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict

from raysgd.worker.handoff import CommitHandoff
from raysgd.worker.live_state import CopiedCommits, create_commit_content


class RankCommits:
    def __init__(self, wait_s: float, views: bool):
        self.handoff = CommitHandoff(wait_s)
        self.views = views
        self.content = CopiedCommits()  # until the operator's optimizers exist (attach)
        self._count, self._hold_s = 0, 0.0

    def attach(self, optimizers: list) -> None:
        """Choose, once per operator, what its commits copy (``live_state``)."""
        self.content = create_commit_content(self.views, optimizers, self.settle)

    def begin_call(self) -> None:
        self._count, self._hold_s = 0, 0.0

    def offer(self, step: int, snapshot: Callable[[], Any]) -> None:
        """Take the commit of ``step`` (``snapshot()``) and hand it over."""
        started = time.perf_counter()
        self.handoff.settle()
        self.handoff.offer(step, snapshot(), self.content.materialize)
        self._count += 1
        self._hold_s += time.perf_counter() - started

    def settle(self) -> None:
        """Wait until no commit views the live state (before it changes)."""
        started = time.perf_counter()
        self.handoff.settle()
        self._hold_s += time.perf_counter() - started

    def stats(self) -> Dict[str, Any]:
        return {"commits": self._count, "commit_hold_s": self._hold_s}
