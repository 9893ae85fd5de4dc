"""The driver's half of stopping a running ``train()`` at one step on every rank.

Mixed into :class:`raysgd.driver.worker_group.WorkerGroup`. The ranks' half and the
reasoning are in :mod:`raysgd.worker.stop_point`: propose a step just past the furthest
rank, confirm it once every rank accepted, else propose one past the furthest boundary
a rank reported. The calls go to each actor's control thread, which answers beside a
running training thread.
"""
from __future__ import annotations

import logging
from typing import Any, List, Optional

import ray
from ray.exceptions import GetTimeoutError, RayError

logger = logging.getLogger("raysgd")

STOP_RPC_S = 5.0  # how long one round of the agreement may take
ROUNDS = 5  # proposals before giving up (each later one is past every rank)


class Stopping:
    """``agree_stop`` over ``self.actors`` (+ ``self.local_runner``)."""

    actors: List[Any]
    local_runner: Any

    def agree_stop(self) -> Optional[int]:
        """Make every rank stop its ``train()`` call at one step boundary and return that
        step, or None when there is none to agree on (a rank's call ended or has not begun,
        a rank died: the caller tries again later, or the call's end or failure handles
        it). Once every rank accepted a step the stop is decided and only confirmed."""
        try:
            target = 1 + max(report["steps"] for report in self._each("progress_report"))
            for _ in range(ROUNDS):
                answers = self._each("propose", target)
                if any(answer["ended"] for answer in answers):
                    break  # the call ends on every rank anyway (or has yet to begin)
                if all(answer["accepted"] for answer in answers):
                    return target if self._confirm(target) else None
                target = max(target, 1 + max(a["passed"] for a in answers))
        except (RayError, GetTimeoutError) as exc:
            logger.warning("raysgd: the ranks could not agree on a step to stop at: %r", exc)
        try:
            self._each("withdraw")
        except (RayError, GetTimeoutError):
            pass  # a rank that cannot be told is failing: the call reports it
        return None

    def _confirm(self, target: int) -> bool:
        """Tell every rank the decided step. A rank that does not hear it in time raises at
        the boundary (the call then fails and is recovered), so no rank trains on alone.
        False when the calls ended before the step (every rank's: they are as long)."""
        try:
            return all(self._each("confirm", target))
        except (RayError, GetTimeoutError) as exc:
            logger.warning("raysgd: a rank did not hear the step to stop at (%r)", exc)
            return True

    def _each(self, action: str, *step: int) -> List[Any]:
        """``action`` on every rank's stop point (``progress_report``: its progress)."""
        if action == "progress_report":
            refs = [actor.progress.remote() for actor in self.actors]
            local = [self.local_runner.progress()] if self.local_runner is not None else []
        else:
            refs = [actor.stop_point.remote(action, *step) for actor in self.actors]
            local = [] if self.local_runner is None else \
                [getattr(self.local_runner.stop_point, action)(*step)]
        return local + ray.get(refs, timeout=STOP_RPC_S)
