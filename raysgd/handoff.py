"""Moving in-epoch commits from the workers to the driver; pure, no Ray.

Worker side, :class:`CommitHandoff`: the training thread offers a commit
every ``checkpoint_every_n_steps`` batches and, on a remote worker, waits
until the driver's standing request (a long poll answered by the worker's
commit thread) has taken it. That wait is what bounds lost work: a rank never
trains past a commit the driver does not hold, so a failure costs at most
one commit interval plus the step in flight. It costs a thread wake-up per
commit when the driver is polling, and at most ``wait_s`` when it is not.

Driver side, :class:`CommitAssembler`: ranks hand their parts over one by
one; a commit exists once every rank handed over the same step.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Dict, List, Optional, Tuple

from raysgd.health import Commit

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


class CommitAssembler:
    """Collects per-rank commit parts until one step is complete on every rank."""

    def __init__(self, world_size: int, committed_step: int):
        self.world_size = world_size
        self.committed_step = committed_step
        self._parts: Dict[int, Dict[int, Tuple[int, Any, int]]] = {}  # step -> rank -> (call_done, ref, epochs)
        self._last_seen: Dict[int, int] = {}

    def after(self, rank: int) -> int:
        """The step a request for ``rank``'s next part should start after."""
        return max(self.committed_step, self._last_seen.get(rank, self.committed_step))

    def add(self, rank: int, step: int, call_done: int, snapshot: Any,
            epochs_done: int = 0) -> Optional[Commit]:
        """Record a part; returns the new :class:`Commit` once ``step`` is complete."""
        self._last_seen[rank] = max(step, self._last_seen.get(rank, step))
        if step <= self.committed_step:
            return None
        parts = self._parts.setdefault(step, {})
        parts[rank] = (call_done, snapshot, epochs_done)
        if len(parts) < self.world_size:
            return None
        self.committed_step = step
        self._parts = {s: p for s, p in self._parts.items() if s > step}
        return Commit(step, parts[0][0], self.world_size,
                      [parts[rank][1] for rank in range(self.world_size)], parts[0][2])
