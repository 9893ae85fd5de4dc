"""``RankCommits``: one rank's in-epoch commits on their way to the driver, and what they
cost the training thread. No Ray.

It puts together the hand-off queue (``raysgd.worker.handoff``), what a commit copies or
views (``raysgd.worker.live_state``, chosen once) and the time commits hold the training
thread up, which ``train(profile=True)`` reports (``commits``, ``commit_hold_s``).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Optional

from raysgd.worker.handoff import CommitHandoff
from raysgd.worker.live_state import CopiedCommits, create_commit_content

logger = logging.getLogger("raysgd")


class RankCommits:
    def __init__(self, wait_s: float, views: bool):
        self.handoff = CommitHandoff(wait_s)
        self.views = views
        self.content = CopiedCommits()  # until the operator's optimizers exist (attach)
        self._count, self._hold_s = 0, 0.0
        self._unchecked: Optional[int] = None  # a viewing commit not yet checked for writes
        self._again = False  # take a commit at the next batch (the last one may be torn)

    def attach(self, optimizers: list) -> None:
        """Choose, once per operator, what its commits copy (``live_state``)."""
        self.content = create_commit_content(self.views, optimizers, self.settle)

    def begin_call(self) -> None:
        self._count, self._hold_s = 0, 0.0

    def due(self, step: int, every: Optional[int]) -> bool:
        """Whether the batch boundary after ``step`` steps takes an in-epoch commit."""
        return bool(every) and (step % every == 0 or self._again)

    def before_batch(self, step: int) -> bool:
        """At the boundary after ``step`` steps: the commit taken a batch ago must have
        reached the driver (``CommitHandoff.wait_landed``: what bounds lost work).
        Returns whether the rank waited; most batches it does not, and are not timed."""
        if not self.handoff.landing:
            return False
        started = time.perf_counter()
        waited = self.handoff.wait_landed(step)
        self._hold_s += time.perf_counter() - started
        return waited

    def offer(self, step: int, snapshot: Callable[[], Any]) -> None:
        """Take the commit of ``step`` (``snapshot()``) and hand it over."""
        started = time.perf_counter()
        self._settle()
        commit = snapshot()
        live = self.content.views()
        self.handoff.offer(step, commit, self.content.materialize if live else None)
        self._count += 1
        self._again = False
        self._unchecked = step if live else None
        self._hold_s += time.perf_counter() - started

    def settle(self) -> None:
        """Wait until no commit views the live state (before it changes)."""
        started = time.perf_counter()
        self._settle()
        self._hold_s += time.perf_counter() - started

    def clear(self) -> None:
        """Forget every commit (a restore replaces the state they were taken from)."""
        self.handoff.clear()
        self._unchecked, self._again = None, False

    def close(self) -> None:
        """The runner is going: forget every commit; waiting requests return at once."""
        self.handoff.close()  # clears the hand-off too
        self._unchecked, self._again = None, False

    def _settle(self) -> None:
        if self._unchecked is not None:
            self._check_writes(self._unchecked)
        self.handoff.settle()

    def _check_writes(self, step: int) -> None:
        """A commit that views parameters or optimizer state assumes only a step writes them;
        code that writes them elsewhere (before a batch's first step) may have torn it."""
        self._unchecked = None
        if self.content.changed():
            logger.warning(
                "raysgd: parameters or optimizer state were written outside an optimizer "
                "step while the commit of step %d viewed them, so that commit may mix two "
                "steps; this rank's commits copy the state from now on, and the next batch "
                "commits again. Write them only in or after a batch's optimizer step to keep "
                "commits free of copies.", step)
            self.content, self._again = CopiedCommits(), True

    def stats(self) -> Dict[str, Any]:
        return {"commits": self._count, "commit_hold_s": self._hold_s}
