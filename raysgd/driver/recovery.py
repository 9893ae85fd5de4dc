"""Retry policy for worker failures: pure decisions as data, no Ray.

The trainer asks the policy what to do after each failure and obeys. The
clock and the jitter source are injectable, so every branch is unit-tested
in milliseconds.

* The first recovery of a ``train()`` call restarts at once: a dead process
  usually leaves its resources free, and waiting would only add lost time.
* Later recoveries in the same call back off exponentially, capped, with
  jitter, so a flapping cluster is not hammered.
* ``max_retries`` bounds recoveries per ``train()`` call and ``budget_s`` the
  time spent recovering in it; either exhausted means raise.
* Restart as many workers as can be placed, at least ``min_workers``; scale
  back up to ``num_workers`` at a later ``train()`` once the cooldown passed.

The user sets its knobs with :class:`raysgd.recovery.FailureConfig`.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable, Optional

from raysgd.errors import ConfigError
from raysgd.recovery import FailureConfig


@dataclass(frozen=True)
class Decision:
    """What to do after a failure: retry with ``num_workers`` after ``wait_s``, or raise."""

    retry: bool
    wait_s: float = 0.0
    num_workers: int = 0
    reason: str = ""


class RecoveryPolicy:
    """Decides retries and worker counts for one trainer."""

    def __init__(self, config: FailureConfig, num_workers: int,
                 clock: Callable[[], float] = time.monotonic,
                 rng: Optional[random.Random] = None):
        if config.min_workers > num_workers:
            raise ConfigError(f"min_workers={config.min_workers} is more than "
                              f"num_workers={num_workers}.")
        self.config = config
        self.num_workers = num_workers
        self.clock = clock
        self.rng = rng or random.Random()
        self._attempts = 0
        self._max_retries = config.max_retries
        self._first_failure: Optional[float] = None
        self._last_resize = clock()

    def start_call(self, max_retries: Optional[int] = None) -> None:
        """A new ``train()`` call: fresh retry count and time budget."""
        self._max_retries = self.config.max_retries if max_retries is None else max_retries
        self._attempts = 0
        self._first_failure = None

    def backoff_s(self, attempt: int) -> float:
        """Wait before recovery number ``attempt`` (1-based) of one call."""
        if attempt <= 1:
            return 0.0
        ceiling = min(self.config.backoff_cap_s, self.config.backoff_base_s * 2 ** (attempt - 2))
        return ceiling * (1 - self.config.jitter * self.rng.random())

    def on_failure(self, placeable_workers: int) -> Decision:
        """After a failure: retry (how many workers, after how long) or raise."""
        now = self.clock()
        if self._first_failure is None:
            self._first_failure = now
        self._attempts += 1
        if self._attempts > self._max_retries:
            return Decision(False, reason=f"max_retries={self._max_retries} recoveries used in this call")
        wait = self.backoff_s(self._attempts)
        if now + wait - self._first_failure > self.config.budget_s:
            return Decision(False, reason=f"recovery time budget of {self.config.budget_s:g}s spent")
        return self._restart(placeable_workers, wait)

    def restart_now(self, placeable_workers: int) -> Decision:
        """Spares could not take the dead ranks' places: start a new group at once (the same
        recovery attempt; ``on_failure`` already counted it)."""
        return self._restart(placeable_workers, 0.0)

    def on_no_capacity(self, placeable_workers: int) -> Decision:
        """A restart could not place its workers: look again after a backoff.

        Waiting for capacity spends the time budget, not ``max_retries``.
        """
        now = self.clock()
        wait = max(self.backoff_s(self._attempts + 1), self.config.backoff_base_s)
        if now + wait - (self._first_failure or now) > self.config.budget_s:
            return Decision(False, reason=f"no capacity within the recovery time budget of "
                                          f"{self.config.budget_s:g}s")
        return self._restart(placeable_workers, wait)

    def _restart(self, placeable: int, wait: float) -> Decision:
        count = min(self.num_workers, placeable)
        if count < self.config.min_workers:
            return Decision(True, wait_s=max(wait, self.config.backoff_base_s), num_workers=0,
                            reason=f"only {placeable} worker(s) placeable, need "
                                   f"min_workers={self.config.min_workers}; waiting")
        reason = "restart" if count == self.num_workers else \
            f"resize to {count} of {self.num_workers} worker(s): only {placeable} placeable"
        return Decision(True, wait_s=wait, num_workers=count, reason=reason)

    def resized(self) -> None:
        self._last_resize = self.clock()

    def scale_up_target(self, current: int, placeable_extra: int) -> int:
        """Worker count to use at the start of a ``train()`` call."""
        if current >= self.num_workers or placeable_extra <= 0:
            return current
        if self.clock() - self._last_resize < self.config.scale_up_cooldown_s:
            return current
        return min(self.num_workers, current + placeable_extra)
