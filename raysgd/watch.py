"""Watch a running train/validate call: health checks, hang detection, commits.

Part of the worker group's Ray boundary. Every ``tick`` it collects the
answers to the previous health checks, asks again, moves an in-epoch commit
forward when every rank holds one for the same step, and raises
:class:`WorkerHangError` when a rank stalls.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.exceptions import RayError

from raysgd.health import Commit, HealthMonitor

logger = logging.getLogger("raysgd")


class CallWatch:
    def __init__(self, group: Any, monitor: HealthMonitor, committed_step: int,
                 on_commit: Optional[Callable[[Commit], None]] = None):
        self.group = group
        self.monitor = monitor
        self.committed_step = committed_step
        self.on_commit = on_commit
        self._asked: Dict[Any, int] = {}  # progress ref -> rank
        self._commit: Optional[tuple] = None  # (step, header refs, snapshot refs)
        monitor.start_call()

    def tick(self) -> None:
        self._collect_progress()
        self._ask_progress()
        if self.on_commit is not None:
            self._advance_commit()
        error = self.monitor.hang_error()
        if error is not None:
            logger.error("raysgd: %s", error)
            raise error

    # ------------------------------------------------------------ progress
    def _remote_ranks(self):
        offset = 1 if self.group.local_runner is not None else 0
        return [(rank + offset, actor) for rank, actor in enumerate(self.group.actors)]

    def _ask_progress(self) -> None:
        waiting = set(self._asked.values())
        for rank, actor in self._remote_ranks():
            if rank not in waiting:
                self._asked[actor.progress.remote()] = rank
                self.monitor.asked(rank)
        if self.group.local_runner is not None:
            self.monitor.observe(0, self.group.local_runner.progress())

    def _collect_progress(self) -> None:
        if not self._asked:
            return
        ready, _ = ray.wait(list(self._asked), num_returns=len(self._asked), timeout=0)
        for ref in ready:
            rank = self._asked.pop(ref)
            try:
                self.monitor.observe(rank, ray.get(ref))
            except RayError:
                pass  # a dead worker: the call itself reports it

    # ------------------------------------------------------------- commits
    def _advance_commit(self) -> None:
        if self._commit is None:
            step = self.monitor.commit_step(after=self.committed_step)
            if step is not None:
                self._commit = (step, *self._ask_commit(step))
            return
        step, headers, snapshots = self._commit
        ready, _ = ray.wait(headers, num_returns=len(headers), timeout=0)
        if len(ready) < len(headers):
            return
        self._commit = None
        try:
            call_done = ray.get(headers)
        except RayError:
            return  # a worker died meanwhile; the call reports it
        if any(c is None for c in call_done):
            return  # a rank moved on to a newer commit; the next tick takes that one
        # Copy the snapshots to the driver's node so a lost worker node loses no commit.
        ray.wait(snapshots, num_returns=len(snapshots), timeout=0, fetch_local=True)
        self.committed_step = step
        self.on_commit(Commit(step, call_done[0], self.group.num_workers, snapshots))

    def _ask_commit(self, step: int):
        headers: List[Any] = []
        snapshots: List[Any] = []
        if self.group.local_runner is not None:
            snap = self.group.local_runner.take_commit(step)
            headers.append(ray.put(snap["call_done"] if snap else None))
            snapshots.append(ray.put(snap))
        for _, actor in self._remote_ranks():
            header, snapshot = actor.take_commit.remote(step)
            headers.append(header)
            snapshots.append(snapshot)
        return headers, snapshots
