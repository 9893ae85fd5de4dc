"""Handing a worker's in-epoch commits to the driver; pure, no Ray.

:class:`CommitHandoff`: the training thread offers a commit
every ``checkpoint_every_n_steps`` batches and, on a remote worker, waits
until the driver's standing request (a long poll answered by the worker's
commit thread) has taken it. That wait is what bounds lost work: a rank never
trains past a commit the driver does not hold, so a failure costs at most
one commit interval plus the step in flight. It costs a thread wake-up per
commit when the driver is polling, and at most ``wait_s`` when it is not.
On the driver, :class:`raysgd.state.commit.CommitAssembler` puts the ranks' parts
together.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, List, Optional

KEEP_COMMITS = 4  # commits held when nobody takes them (a runner used on its own)


class CommitHandoff:
    """The queue of commits one rank has made but the driver has not taken."""

    def __init__(self, wait_s: float = 0.0):
        self.wait_s = wait_s
        self._cond = threading.Condition()
        self._queue: "collections.OrderedDict[int, Any]" = collections.OrderedDict()
        self._ticket = 0

    def offer(self, step: int, commit: Any) -> bool:
        """Queue ``commit``; with ``wait_s`` wait until it is taken. True if it was."""
        with self._cond:
            self._queue[step] = commit
            while len(self._queue) > KEEP_COMMITS:
                self._queue.popitem(last=False)
            self._cond.notify_all()
            if self.wait_s <= 0:
                return False
            return self._cond.wait_for(lambda: step not in self._queue, timeout=self.wait_s)

    def take(self, after: int, wait_s: float = 0.0, ticket: int = 0) -> Optional[Any]:
        """The oldest commit newer than ``after``, waiting up to ``wait_s`` for one.

        Older ones are dropped: the driver has moved past them. ``ticket``
        names the driver's call: a request from a newer call releases a
        waiting older one empty-handed, so a request left over from the
        previous call never takes (and loses) a commit of the next.
        """
        with self._cond:
            if ticket < self._ticket:
                return None
            if ticket > self._ticket:
                self._ticket = ticket
                self._cond.notify_all()
            ready = self._cond.wait_for(lambda: self._ticket > ticket or self._newer(after),
                                        timeout=wait_s)
            if not ready or self._ticket > ticket:
                return None
            for step in [s for s in self._queue if s <= after]:
                del self._queue[step]
            step, commit = self._queue.popitem(last=False)
            self._cond.notify_all()
            return commit

    def steps(self) -> List[int]:
        with self._cond:
            return list(self._queue)

    def clear(self) -> None:
        with self._cond:
            self._queue.clear()
            self._cond.notify_all()

    def _newer(self, after: int) -> bool:
        return any(step > after for step in self._queue)
