"""Handing a worker's in-epoch commits to the driver; pure, no Ray.

:class:`CommitHandoff`: the training thread offers a commit
every ``checkpoint_every_n_steps`` batches and, on a remote worker, waits
until the driver's standing request (a long poll answered by the worker's
commit thread) has taken it. Taken is not yet held: Ray still sends the commit
to the driver, and a rank killed meanwhile loses it. So the training thread
waits once more, before the second batch after the commit
(:meth:`CommitHandoff.wait_landed`), until the driver's next request (sent once
it holds the commit) acknowledges it; one batch is ample time for that, so the
wait is normally empty. These waits are what bound lost work: a rank never
trains two batches past a commit the driver does not hold, so a failure costs
at most one commit interval plus the step in flight. They cost a thread
wake-up per commit when the driver is polling, and at most ``wait_s`` when it
is not.
On the driver, :class:`raysgd.state.commit.CommitAssembler` puts the ranks' parts
together.

A commit may view the live state instead of copying it (``offer(..., materialize)``,
``raysgd.worker.live_state``): Ray then copies those tensors into the object store while it
stores the taken commit, beside the next batch's forward and backward. Before the live
state next changes (the optimizer's step, the next batch, the call's end) the training
thread calls :meth:`CommitHandoff.settle`: a commit still queued gets its own copy
(``materialize``), and one taken is waited for until the driver acknowledges it: its next
request starts after that step, which it can only send once the commit is stored.
"""
from __future__ import annotations

import collections
import logging
import threading
from typing import Any, Callable, Dict, List, Optional

KEEP_COMMITS = 4  # commits held when nobody takes them (a runner used on its own)

logger = logging.getLogger("raysgd")


class CommitHandoff:
    """The queue of commits one rank has made but the driver has not taken."""

    def __init__(self, wait_s: float = 0.0):
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._queue: "collections.OrderedDict[int, Any]" = collections.OrderedDict()
        self._ticket = 0
        # queued steps whose commit views the live state -> how to give it its own copy
        self._live: Dict[int, Callable[[Any], Any]] = {}
        self._storing: Optional[int] = None  # a live commit taken, not yet acknowledged
        self._landing: Optional[int] = None  # any commit taken, not yet acknowledged
        self._landing_ticket = 0  # the call whose request took it

    def offer(self, step: int, commit: Any,
              materialize: Optional[Callable[[Any], Any]] = None) -> bool:
        """Queue ``commit``; with ``wait_s`` wait until it is taken. True if it was.
        ``materialize`` marks a commit that views the live state (see :meth:`settle`)."""
        with self._cond:
            self._queue[step] = commit
            if materialize is not None:
                self._live[step] = materialize
            while len(self._queue) > KEEP_COMMITS:
                self._live.pop(self._queue.popitem(last=False)[0], None)
            self._cond.notify_all()
            if self.wait_s <= 0:
                return False
            return self._cond.wait_for(lambda: step not in self._queue, timeout=self.wait_s)

    def take(self, after: int, wait_s: float = 0.0, ticket: int = 0) -> Optional[Any]:
        """The oldest commit newer than ``after``, waiting up to ``wait_s`` for one.

        Older ones are dropped: the driver has moved past them. ``ticket``
        names the driver's call: a request from a newer call releases a
        waiting older one empty-handed, so a request left over from the
        previous call never takes (and loses) a commit of the next. A request
        starting at or after a live commit it took before acknowledges it.

        A call's start (:meth:`begin`) answers the previous call's requests, so none of
        them takes the call's first commit, which the driver would never hold. A request
        of a newer call than the one that took a commit ends the wait for it
        (:meth:`wait_landed`): the rank waits for nothing the driver will acknowledge.
        """
        with self._cond:
            if self._storing is not None and after >= self._storing:
                self._storing = None
                self._cond.notify_all()
            if self._landing is not None and after >= self._landing:
                self._landing = None
                self._cond.notify_all()
            if ticket < self._ticket:
                return None
            self._advance(ticket)
            ready = self._cond.wait_for(lambda: self._ticket > ticket or self._newer(after),
                                        timeout=wait_s)
            if not ready or self._ticket > ticket:
                return None
            for step in [s for s in self._queue if s <= after]:
                del self._queue[step]
                self._live.pop(step, None)
            step, commit = self._queue.popitem(last=False)
            if self._live.pop(step, None) is not None:
                self._storing = step
            self._landing, self._landing_ticket = step, ticket
            self._cond.notify_all()
            return commit

    def begin(self, ticket: int) -> None:
        """The driver's call ``ticket`` starts on this rank, before it offers any commit:
        a request of an older call still waiting is answered empty-handed now, so it cannot
        take this call's first commit (the driver closed that call and would never
        acknowledge it, and a live commit would hold the next optimizer step ``wait_s``).
        Nothing an older call's request took will be acknowledged either."""
        with self._cond:
            self._advance(ticket)

    def settle(self) -> None:
        """Call before the live state changes: queued commits that view it get their own
        copies, and a taken one is waited for (at most ``wait_s``) until the driver
        acknowledges it."""
        with self._cond:
            for step, materialize in self._live.items():
                self._queue[step] = materialize(self._queue[step])
            self._live.clear()
            if self._storing is None:
                return
            if not self._cond.wait_for(lambda: self._storing is None, timeout=self.wait_s):
                # Storing takes a memory copy's time; after wait_s the driver stopped asking.
                logger.warning("raysgd: the driver did not acknowledge the commit of step %d "
                               "within %.0f s; training on", self._storing, self.wait_s)
                self._storing = None

    @property
    def landing(self) -> bool:
        """Whether a commit was taken that the driver has not acknowledged yet."""
        return self._landing is not None

    def wait_landed(self, step: int) -> bool:
        """Before the batch after step ``step``: a commit taken before ``step`` (so a whole
        batch ago) is waited for (at most ``wait_s``) until the driver acknowledges it.
        Returns whether there was anything to wait for."""
        if not self.landing:  # most batches: no lock (a take sets it before offer returns)
            return False
        with self._cond:
            if self._landing is None or step <= self._landing or self.wait_s <= 0:
                return False  # wait_s 0: a rank in the driver, whose commits take no transfer
            if not self._cond.wait_for(lambda: self._landing is None, timeout=self.wait_s):
                logger.warning("raysgd: the driver did not acknowledge the commit of step %d "
                               "within %.0f s; training on", self._landing, self.wait_s)
                self._landing = None
            return True

    def steps(self) -> List[int]:
        with self._cond:
            return list(self._queue)

    def clear(self) -> None:
        with self._cond:
            self._queue.clear()
            self._live.clear()
            self._storing = self._landing = None
            self._cond.notify_all()

    def close(self) -> None:
        """The runner is going (its trainer shut down): forget every commit and answer a
        waiting request at once. Left waiting, it would hold one of the worker's commit
        threads for its whole ``wait_s``, so that the next trainer on this warm process
        would have one thread, and its previous call's request could take its next call's
        commit."""
        with self._cond:
            self._advance(1 << 62)  # every request is from an older call now
        self.clear()

    def _advance(self, ticket: int) -> None:
        """Under the lock: a call newer than any seen adopts ``ticket``. Requests of older
        calls are released empty-handed, and nothing they took will be acknowledged."""
        if ticket <= self._ticket:
            return
        self._ticket = ticket
        if self._landing is not None and ticket > self._landing_ticket:
            self._landing = None
        self._cond.notify_all()

    def _newer(self, after: int) -> bool:
        return any(step > after for step in self._queue)
