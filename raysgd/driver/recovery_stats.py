"""What fault tolerance has done (``trainer.recovery_stats``), and where each recovery's
seconds went. No Ray.

A recovery runs on the driver from the moment it sees a failure to the next step a rank
completes. :class:`RecoveryClock` times its parts as the supervisor runs them, so a user (and
``make bench-chaos``) can see which part a slow recovery spent its time in:

- ``detect_s``: from the dead ranks' last answer to the driver (it asks every rank how far
  it got four times a second during a call) to the driver seeing the failure: the death
  itself lies in between, so this slightly overstates detection (absent when the failure
  came outside a train or validate call);
- ``survivors_s``: asking the survivors for their live state (replicated strategies);
- ``replace_s``: newcomers taking the dead ranks' places beside the survivors (a warm spare or
  a new process, its reservation and the process group formed again);
- ``restart_s``: a whole new group, where the survivors could not stay (or a replace failed);
- ``restore_s``: every rank loading the commit;
- ``backoff_s``: waits the retry policy asked for between attempts;
- ``first_step_s``: from the end of the last of those to the next completed step (the batch in
  flight done again, the call resumed);
- ``other_s``: the driver's own work between those parts (its decisions, logging);
- ``total_s``: all of it, the sum of the others (the figure ``recovery_times_s`` lists).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Tuple


@dataclass
class RecoveryStats:
    """What fault tolerance has done so far (``trainer.recovery_stats``)."""

    failures: int = 0
    recoveries: int = 0
    steps_lost: int = 0
    recovery_times_s: List[float] = field(default_factory=list)
    num_workers: int = 0
    resizes: List[Tuple[int, int, str]] = field(default_factory=list)
    user_errors: int = 0  # exceptions from user code, each rolled back to the last commit
    preemptions: int = 0  # ranks moved off a draining node (not failures: no retry spent)
    # Seconds from each preemption notice to the next completed step.
    handover_times_s: List[float] = field(default_factory=list)
    # Per recovery, where its seconds went (``RecoveryClock``'s parts), in recovery order.
    recovery_phases: List[Dict[str, float]] = field(default_factory=list)
    # Steps between in-epoch commits in the next train() call (None: none inside a call);
    # chosen per call under checkpoint_every_n_steps="auto" (raysgd.commits.interval).
    commit_interval: Optional[int] = None

    @property
    def last_recovery_s(self) -> Optional[float]:
        """Seconds from the last failure to the next completed step."""
        return self.recovery_times_s[-1] if self.recovery_times_s else None


class RecoveryClock:
    """Times the parts of the recovery under way (see the module's docstring); outside a
    recovery, :meth:`phase` times nothing (a rollback after a user error is no recovery)."""

    def __init__(self, clock: Callable[[], float] = time.time):
        self._clock = clock  # wall time: the ranks report their first step's wall time
        self._began: Optional[float] = None
        self._last = 0.0
        self._parts: Dict[str, float] = {}

    @property
    def running(self) -> bool:
        return self._began is not None

    def start(self, since: Optional[float] = None) -> None:
        """The driver saw a failure (a second one inside a recovery adds to the same);
        ``since``: when its dead ranks last answered, where known (the recovery counts from
        there, the wait until the driver saw it being its ``detect_s``)."""
        if self._began is None:
            self._began = self._last = self._clock()
            self._parts = {}
            if since is not None and since < self._began:
                self._parts["detect_s"] = self._began - since
                self._began = since

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self._began is None:
            yield
            return
        began = self._clock()
        try:
            yield
        finally:
            self._last = self._clock()
            key = f"{name}_s"
            self._parts[key] = self._parts.get(key, 0.0) + self._last - began

    def finish(self, first_step_wall: Optional[float]) -> Optional[Dict[str, float]]:
        """The recovery's parts once a rank completed a step at ``first_step_wall`` (None:
        now); None when no recovery was under way."""
        if self._began is None:
            return None
        end = max(first_step_wall or self._clock(), self._last)
        total, timed = end - self._began, sum(self._parts.values())
        parts = {**self._parts, "first_step_s": end - self._last,
                 "other_s": max(0.0, self._last - self._began - timed), "total_s": total}
        self._began = None
        return parts
