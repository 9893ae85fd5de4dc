"""The disk writer's queue: at most one pending checkpoint per kind (``latest``, ``best``),
and what happens to a write the storage failed. Pure bookkeeping, no thread and no clock of
its own: ``raysgd.state.disk_checkpoints.DiskCheckpointer`` calls it under its lock.

- A newer commit replaces a pending one of its kind (it holds everything the older did);
  if the older one was a write the storage had failed, it never reaches the storage and is
  counted in :attr:`WriteQueue.never_written`.
- A failed write comes back as a retry after a backoff (1 s, doubling to 30 s), unless a
  newer commit of its kind is already waiting.
- :meth:`WriteQueue.next` picks the job due first: a call-end commit waits a short settle
  time unless someone flushes, a retry waits out its backoff unless the writer is closing
  (one more try, then it is given up).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
KINDS = ("best", "latest")  # on a tie, best first: it is written rarely and matters


@dataclass
class Job:
    commit: Any
    score: Optional[float]
    not_before: float  # monotonic time
    retry: bool = False  # the storage failed it before


class WriteQueue:
    def __init__(self) -> None:
        self.pending: Dict[str, Job] = {}
        self.failed_tries = 0  # storage failures in a row (0 once a write lands)
        self.never_written: List[int] = []  # steps whose checkpoint the storage never took
        self.landed: Dict[str, Any] = {}  # kind -> the last commit written

    def submit(self, kind: str, commit: Any, score: Optional[float], not_before: float) -> None:
        replaced = self.pending.get(kind)
        if replaced is not None and replaced.retry and replaced.commit is not commit:
            self.never_written.append(replaced.commit.step)
        self.pending[kind] = Job(commit, score, not_before)

    def next(self, now: float, flushing: bool, closing: bool) -> Tuple[Optional[str], float]:
        """``(kind, seconds until it is due)`` of the job to write next; ``(None, 0)``."""
        def due(job: Job) -> float:
            if closing or (flushing and not job.retry):
                return now
            return job.not_before

        ready = [(due(self.pending[kind]), KINDS.index(kind), kind) for kind in self.pending]
        if not ready:
            return None, 0.0
        when, _, kind = min(ready)
        return kind, when - now

    def pop(self, kind: str) -> Job:
        return self.pending.pop(kind)

    def wrote(self, kind: str, job: Job) -> bool:
        """The write landed; True when it ends a run of storage failures."""
        self.landed[kind] = job.commit
        recovered, self.failed_tries = self.failed_tries > 0, 0
        return recovered

    def failed(self, kind: str, job: Job, now: float, closing: bool) -> Optional[float]:
        """The storage failed ``job``: the backoff before its retry, or None when it is
        given up (a newer commit waits, or a close already tried it again)."""
        self.failed_tries += 1
        newer = self.pending.get(kind)
        if newer is not None:
            if newer.commit is not job.commit:
                self.never_written.append(job.commit.step)
            return None
        if closing and job.retry:
            self.never_written.append(job.commit.step)
            return None
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self.failed_tries - 1))
        self.pending[kind] = Job(job.commit, job.score, now + delay, retry=True)
        return delay

    def abandon(self) -> None:
        """Closing: whatever is still pending never reaches the storage."""
        self.never_written += [job.commit.step for job in self.pending.values()]
        self.pending.clear()

    def unwritten(self) -> List[int]:
        return sorted(set(self.never_written))
