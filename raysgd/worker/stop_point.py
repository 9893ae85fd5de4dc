"""Where every rank stops a ``train()`` call together, for a hand-over; pure, no Ray.

When a node that holds ranks is about to be preempted, the driver stops the call at a
step boundary, takes the commit of that step and moves the node's ranks elsewhere, so
nothing trained is lost. Ranks run in lockstep only up to a step or so, and the
driver's message reaches each at a different moment, so the step is agreed in two
phases: the driver proposes a step to every rank (:meth:`StopPoint.propose`, from the
actor's control thread); a rank accepts when its call runs and it has not yet passed
that boundary. A rank that reaches the proposed boundary while the proposal is open
waits there, so no rank can pass a step another still accepts. If every rank accepted,
the stop is decided: the driver confirms on every rank and every rank stops at that
boundary; otherwise it proposes a later step. A call that ended closes the point, so a
late proposal is refused and nothing stays armed for the next call.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Optional

# How long a rank waits at a proposed boundary for the driver's word. Longer means the
# driver is gone or stuck; training on alone could leave another rank stopped there, so
# the rank raises instead (the call fails and is recovered).
DECIDE_WAIT_S = 60.0


class StopHere(BaseException):
    """Raised through the operator's loop at the agreed boundary, carrying the commit of
    that step. A ``BaseException`` so that user code catching ``Exception`` lets it by."""

    def __init__(self, snapshot: Any):
        super().__init__("train() stopped at an agreed step for a hand-over")
        self.snapshot = snapshot


class NoWordError(RuntimeError):
    """A rank waited at a proposed boundary and the driver never decided."""


class StopPoint:
    """One rank's side of the agreement (module docstring)."""

    def __init__(self, decide_wait_s: float = DECIDE_WAIT_S):
        self.decide_wait_s = decide_wait_s
        self._cond = threading.Condition()
        self._open = False  # a train() call runs
        self._passed = -1  # the last boundary this rank went through
        self._proposed: Optional[int] = None
        self._confirmed: Optional[int] = None

    def open(self, step: int) -> None:
        """A ``train()`` call starts at ``step``: proposals are taken from now on."""
        with self._cond:
            self._open, self._passed = True, step - 1
            self._proposed = self._confirmed = None
            self._cond.notify_all()

    def close(self) -> None:
        """The call ended (or was stopped): proposals are refused until the next one."""
        with self._cond:
            self._open = False
            self._proposed = self._confirmed = None
            self._cond.notify_all()

    def propose(self, step: int) -> Dict[str, Any]:
        """The driver proposes stopping at ``step`` (replacing an open proposal). Accepted
        when the call runs and this rank has not yet passed that boundary; the answer says
        the last one it passed (so a new proposal can be later) and whether its call ended."""
        with self._cond:
            accepted = self._open and step > self._passed
            self._proposed = step if accepted else None
            self._confirmed = None
            self._cond.notify_all()
            return {"accepted": accepted, "passed": self._passed, "ended": not self._open}

    def confirm(self, step: int) -> bool:
        """Every rank accepted ``step``: stop there. False when this rank's call ended first
        (then every rank's did: their calls are as long, and ``step`` lies past the end)."""
        with self._cond:
            if self._proposed != step:
                return False
            self._confirmed = step
            self._cond.notify_all()
            return True

    def withdraw(self) -> None:
        """No stop after all (a proposal some rank refused)."""
        with self._cond:
            self._proposed = self._confirmed = None
            self._cond.notify_all()

    def at_boundary(self, step: int) -> bool:
        """Called by the training thread before the batch after ``step`` steps: True when
        the call stops here. A rank at an open proposal's boundary waits for the word."""
        with self._cond:
            if self._proposed == step and self._confirmed is None:
                decided = self._cond.wait_for(
                    lambda: self._proposed != step or self._confirmed == step,
                    timeout=self.decide_wait_s)
                if not decided:
                    raise NoWordError(f"waited {self.decide_wait_s:.0f}s at step {step} for the "
                                      "driver to decide on a stop")
            if self._confirmed is not None and self._confirmed == step:
                self._open = False
                self._proposed = self._confirmed = None
                return True
            self._passed = max(self._passed, step)
            return False
