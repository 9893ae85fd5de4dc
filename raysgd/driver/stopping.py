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
        step, or None when the ranks could not agree (a rank died, or its call ended)."""
        try:
            target = 1 + max(report["steps"] for report in self._each("progress_report"))
            for _ in range(ROUNDS):
                answers = self._each("propose", target)
                if all(answer["accepted"] for answer in answers):
                    if all(self._each("confirm", target)):
                        return target
                    target += 1  # a rank's proposal lapsed before the word came
                else:
                    target = max(target, 1 + max(a["passed"] for a in answers))
        except (RayError, GetTimeoutError) as exc:
            logger.warning("raysgd: the ranks could not agree on a step to stop at: %r", exc)
        try:
            self._each("withdraw")
        except (RayError, GetTimeoutError):
            pass
        return None

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
