"""How many steps apart in-epoch commits are: a number the user forced, or ``"auto"``. No Ray.

``"auto"`` (the default) chooses from what commits are measured to cost. Each ``train()``
call's ranks report how long commits held their training threads up and how long their steps
took (``observe``; a call without in-epoch commits reports its call-end commit instead); the
driver picks the next call's interval from the slowest rank's figures:

- before any failure, the fewest steps apart that keep the commits' cost within ``budget``
  of the training time (2 %): cost ÷ (budget × step time);
- once failures that rolled back to a commit have been seen, Young–Daly's optimum
  √(2 · cost · MTBF), in steps: the interval that loses the least time to commits and
  redone steps together, with the mean time between such failures measured over the
  training time so far. A failure the survivors' live state recovered from redoes one
  batch whatever the interval, so it does not count.

Every rank gets the same interval with its call, so all ranks commit at the same steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

AUTO = "auto"
BUDGET = 0.02  # the share of training time "auto" lets commits cost before any failure
START = 50  # "auto"'s interval until a call has measured what a commit costs
LONGEST = 10_000  # "auto" never commits further apart than this
SMOOTHING = 0.5  # the weight of the newest call's figures in the running estimates


@dataclass(frozen=True)
class Interval:
    """The interval a call runs with; ``why``: "forced", "start", "budget" or "young-daly"."""

    steps: Optional[int]
    why: str


@dataclass(frozen=True)
class CallCost:
    """One rank's figures for a call: ``steps`` run in ``train_s`` seconds, ``commits`` taken,
    holding its training thread up for ``commit_s`` of them; ``end_s``: the call-end commit's
    seconds, which stand in for an in-epoch one's until a call has taken one."""

    steps: int
    train_s: float
    commits: int
    commit_s: float
    end_s: float = 0.0

    @property
    def per_commit_s(self) -> Optional[float]:
        if self.commits:
            return self.commit_s / self.commits
        return self.end_s or None


class FixedInterval:
    """A number (or None: commits only at call ends) the user chose."""

    def __init__(self, steps: Optional[int]):
        self.current = Interval(steps, "forced")

    def observe(self, costs: Sequence[CallCost]) -> None:
        pass

    def failed(self) -> None:
        pass


class AutoInterval:
    """``"auto"``: see the module's docstring. ``divides``: a disk interval the choice must
    divide (only commits reach the disk), or None."""

    def __init__(self, budget: float = BUDGET, start: int = START):
        self.budget, self.divides = budget, None
        self.commit_s: Optional[float] = None  # per commit, smoothed
        self.step_s: Optional[float] = None  # per step, commits' cost left out, smoothed
        self.train_s, self.failures = 0.0, 0
        self.current = Interval(start, "start")

    def aligned(self, every: int) -> None:
        """Choices must divide ``every`` (a disk checkpoint's interval)."""
        self.divides = every
        self.current = Interval(_divisor_at_most(every, self.current.steps), self.current.why)

    def observe(self, costs: Sequence[CallCost]) -> None:
        """A call's figures, one per rank; the next call's interval follows from them."""
        measured = [c for c in costs if c.steps > 0 and c.per_commit_s is not None]
        if costs:
            self.train_s += max(c.train_s for c in costs)
        in_epoch = [c for c in measured if c.commits]
        if in_epoch:
            measured = in_epoch
        elif self.commit_s is not None or not measured:
            return  # an in-epoch figure (or none) beats a call end's
        self.commit_s = _smoothed(self.commit_s, max(c.per_commit_s for c in measured))
        step_s = max((c.train_s - c.commit_s) / c.steps for c in measured)
        self.step_s = _smoothed(self.step_s, max(step_s, 1e-6))
        self.current = self._choose()

    def failed(self) -> None:
        """A failure rolled back to a commit, so the interval decided the steps it redid:
        from now on the choice weighs those too. The supervisor tells only those: one the
        survivors' live state recovered from redoes a batch whatever the interval."""
        self.failures += 1
        if self.commit_s is not None:
            self.current = self._choose()

    def _choose(self) -> Interval:
        if self.failures:
            mtbf = max(self.train_s, self.step_s) / self.failures
            steps, why = math.sqrt(2 * self.commit_s * mtbf) / self.step_s, "young-daly"
        else:
            steps, why = self.commit_s / (self.budget * self.step_s), "budget"
        steps = min(LONGEST, max(1, math.ceil(steps)))
        if self.divides:
            steps = _divisor_at_most(self.divides, steps)
        return Interval(steps, why)


def _smoothed(old: Optional[float], new: float) -> float:
    return new if old is None else SMOOTHING * new + (1 - SMOOTHING) * old


def _divisor_at_most(number: int, most: Optional[int]) -> int:
    """The largest divisor of ``number`` that is at most ``most`` (at least 1)."""
    most = number if most is None else min(number, most)
    return next(d for d in range(max(1, most), 0, -1) if number % d == 0)


def create_interval(every: Union[int, str, None], divides: Optional[int] = None):
    """The interval object for ``checkpoint_every_n_steps`` (checked already); ``divides``:
    a disk interval an ``"auto"`` choice must divide (a number was checked to)."""
    if every != AUTO:
        return FixedInterval(every)
    interval = AutoInterval()
    if divides:
        interval.aligned(divides)
    return interval
