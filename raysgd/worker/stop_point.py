"""Where every rank stops a ``train()`` call together, for a hand-over; pure, no Ray.

When a node that holds ranks is about to be preempted, the driver stops the call at a
step boundary, takes the commit of that step and moves the node's ranks elsewhere, so
nothing trained is lost. Ranks run in lockstep only up to a step or so, and the
driver's message reaches each at a different moment, so the step is agreed in two
phases: the driver proposes a step to every rank (:meth:`StopPoint.propose`, from the
actor's control thread); a rank accepts when it has not yet passed that boundary. A
rank that reaches the proposed boundary while the proposal is open waits there, so no
rank can pass a step another still accepts. If every rank accepted, the driver
confirms and every rank stops at that boundary; otherwise it proposes a later step.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Optional

# How long a rank waits at a proposed boundary for the driver's word. Longer means the
# driver is gone or stuck; the rank then trains on (the proposal lapses).
DECIDE_WAIT_S = 10.0


class StopHere(BaseException):
    """Raised through the operator's loop at the agreed boundary, carrying the commit of
    that step. A ``BaseException`` so that user code catching ``Exception`` lets it by."""

    def __init__(self, snapshot: Any):
        super().__init__("train() stopped at an agreed step for a hand-over")
        self.snapshot = snapshot


class StopPoint:
    """One rank's side of the agreement (module docstring)."""

    def __init__(self, decide_wait_s: float = DECIDE_WAIT_S):
        self.decide_wait_s = decide_wait_s
        self._cond = threading.Condition()
        self._passed = -1  # the last boundary this rank went through
        self._proposed: Optional[int] = None
        self._confirmed: Optional[int] = None

    def propose(self, step: int) -> Dict[str, Any]:
        """The driver proposes stopping at ``step`` (replacing an open proposal). Accepted
        when this rank has not yet passed that boundary; the answer says the last one it
        passed, so a new proposal can be later."""
        with self._cond:
            accepted = step > self._passed
            self._proposed = step if accepted else None
            self._confirmed = None
            self._cond.notify_all()
            return {"accepted": accepted, "passed": self._passed}

    def confirm(self, step: int) -> bool:
        """Every rank accepted ``step``: stop there. False if this rank's proposal lapsed
        (the driver then stops the call another way)."""
        with self._cond:
            if self._proposed != step:
                return False
            self._confirmed = step
            self._cond.notify_all()
            return True

    def withdraw(self) -> None:
        """No stop after all (the call ended, or another proposal failed)."""
        with self._cond:
            self._proposed = self._confirmed = None
            self._cond.notify_all()

    def reset(self, step: int) -> None:
        """The rank now stands at ``step`` (a restore moved it): no proposal is open."""
        with self._cond:
            self._passed, self._proposed, self._confirmed = step - 1, None, None
            self._cond.notify_all()

    def at_boundary(self, step: int) -> bool:
        """Called by the training thread before the batch after ``step`` steps: True when
        the call stops here. A rank at an open proposal's boundary waits for the word."""
        with self._cond:
            if self._proposed == step and self._confirmed is None:
                self._cond.wait_for(lambda: self._proposed != step or self._confirmed == step,
                                    timeout=self.decide_wait_s)
            if self._confirmed is not None and self._confirmed == step:
                self._proposed = self._confirmed = None
                return True
            if self._proposed == step:  # no word in time: the proposal lapses
                self._proposed = None
            self._passed = max(self._passed, step)
            return False
