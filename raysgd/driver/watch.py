"""Watch a running train/validate call: health checks, hang detection, commits.

Part of the worker group's Ray boundary. Every ``tick`` it collects the
answers to the previous health checks and asks again, and raises
:class:`WorkerHangError` when a rank stalls. With commits on, it keeps one
standing ``next_commit`` request per remote rank (see :mod:`raysgd.worker.handoff`);
the driver wakes as soon as one is answered, and a commit moves forward once
every rank handed over the same step. The same progress reports feed the
driver's progress bar (see :mod:`raysgd.driver.progress`). Also the legacy
``check_for_failure``.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import ray
from ray.exceptions import RayActorError, RayError

from raysgd.driver.health import HealthMonitor
from raysgd.state.commit import Commit, CommitAssembler

logger = logging.getLogger("raysgd")

# A standing commit request returns empty after this long and is asked again.
COMMIT_POLL_S = 2.0
# How often each rank is asked for a progress report. Hangs are judged in
# seconds (timeout_s) and a progress bar reads well at a few updates a second;
# asking more often only takes CPU from the workers on small machines.
PROGRESS_EVERY_S = 0.25
# A rank this late with its progress answer has its node checked (at most this often): a
# node that died answers no call, and Ray reports its ranks' deaths only seconds later.
LATE_S = 0.5


def fetch_to_driver(snapshots: List[Any]) -> List[Any]:
    """A commit's snapshots as values (the disk writer's ``fetch``)."""
    refs = [ref for ref in snapshots if isinstance(ref, ray.ObjectRef)]
    if refs and not ray.is_initialized():  # ray.get would start a new, empty Ray
        raise RuntimeError("Ray was shut down before the trainer, so its last commit is gone; "
                           "call trainer.shutdown() before ray.shutdown().")
    values = iter(ray.get(refs)) if refs else iter(())
    return [next(values) if isinstance(s, ray.ObjectRef) else s for s in snapshots]


class StandingPolls:
    """A group's standing ``next_commit`` requests, kept across its calls: an answer that
    comes after its call ended (the call's result came first) is still read, for the slab
    its commit used up (``consumed``). Dropped, it would leave the driver thinking the rank
    still holds that slab, and the rank would never be named another. Also numbers the calls
    (the tickets of their requests)."""

    def __init__(self) -> None:
        self.ticket = 0
        self.open: Dict[Any, Tuple[int, Any, int]] = {}  # header ref -> (rank, snapshot, ticket)

    def next_ticket(self) -> int:
        self.ticket += 1
        return self.ticket


class CallWatch:
    def __init__(self, group: Any, monitor: HealthMonitor, committed_step: int,
                 on_commit: Optional[Callable[[Commit], None]] = None, ticket: int = 0,
                 on_progress: Optional[Callable[[Dict[int, Any]], None]] = None,
                 on_tick: Optional[Callable[[], None]] = None):
        self.group = group
        self.on_tick = on_tick  # the supervisor's preemption watch, every tick
        self.monitor = monitor
        self.committed_step = committed_step
        self.on_commit = on_commit
        self.ticket = ticket
        self.on_progress = on_progress
        self._asked: Dict[Any, int] = {}  # progress ref -> rank
        self._next_ask = 0.0
        self._next_node_check = 0.0
        self.assembler = CommitAssembler(monitor.world_size, committed_step)
        self._polls = group.polls.open  # a request of an earlier call is answered empty
        self._dead: Set[int] = set()
        monitor.start_call()
        if on_commit is not None:
            self._ask_commits()

    def tick(self) -> None:
        self._collect_progress()
        self._ask_progress()
        if self.on_progress is not None:
            self.on_progress(self.monitor.reports)
        if self.on_commit is not None:
            self._advance_commit()
        if self.on_tick is not None:
            self.on_tick()
        error = self.monitor.hang_error()
        if error is not None:
            logger.error("raysgd: %s", error)
            raise error

    def lost_ranks(self) -> List[Any]:
        """Failures for the ranks late with their progress answer whose node died."""
        now, late = time.monotonic(), self.monitor.late(LATE_S)
        if not late or now < self._next_node_check:
            return []
        self._next_node_check = now + LATE_S
        return self.group.on_lost_nodes(late)

    # ------------------------------------------------------------ progress
    def _remote_ranks(self):
        offset = 1 if self.group.local_runner is not None else 0
        return [(rank + offset, actor) for rank, actor in enumerate(self.group.actors)]

    def _ask_progress(self) -> None:
        now = time.monotonic()
        if now < self._next_ask:
            return
        self._next_ask = now + PROGRESS_EVERY_S
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
    def wake_refs(self) -> List[Any]:
        """References whose arrival should wake the waiting driver (commit parts)."""
        return list(self._polls)

    def _advance_commit(self) -> None:
        if self._polls:
            ready, _ = ray.wait(list(self._polls), num_returns=len(self._polls), timeout=0)
            for ref in ready:
                self._receive(ref, *self._polls.pop(ref))
        self._take_local()
        self._ask_commits()

    def _receive(self, header_ref, rank: int, snapshot_ref, ticket: int) -> None:
        try:
            header = ray.get(header_ref)
        except RayError:
            if ticket == self.ticket:  # not the rank a newcomer has taken since
                self._dead.add(rank)  # a worker died meanwhile; the call reports it
            return
        if header is not None:
            self.group.slabs.consumed(rank, header.get("slab_version"))
        if header is not None and ticket == self.ticket:  # an earlier call's is past
            self._add(rank, header["step"], header["call_done"], snapshot_ref,
                      header["epochs_done"], header)

    def _add(self, rank: int, step: int, call_done: int, snapshot: Any, epochs_done: int,
             header: Optional[dict] = None) -> None:
        commit = self.assembler.add(rank, step, call_done, snapshot, epochs_done, header)
        if commit is None:
            return
        self.committed_step = commit.step
        self.on_commit(commit)

    def _take_local(self) -> None:
        runner = self.group.local_runner
        while runner is not None:
            snap = runner.next_commit(self.assembler.after(0), 0.0, self.ticket)
            if snap is None:
                return
            self._add(0, snap["step"], snap["call_done"], ray.put(snap), snap["epochs_done"])

    def _ask_commits(self) -> None:
        asking = {rank for rank, _, _ in self._polls.values()}
        ranks = [rank for rank, _ in self._remote_ranks()
                 if rank not in asking and rank not in self._dead]
        if not ranks:
            return
        # A rank whose last commit used its slab up gets the next one with its request.
        slabs = self.group.slabs.targets(self.group.rank_nodes, self.group.process_keys(), ranks,
                                         self.assembler.in_slabs())
        later = waits_for_a_slot(self.group.slabs.full(), self.assembler.waiting())
        for rank, actor in self._remote_ranks():
            if rank in ranks and rank not in later:
                header, snapshot = actor.next_commit.remote(self.assembler.after(rank),
                                                            COMMIT_POLL_S, self.ticket,
                                                            slabs[rank])
                self._polls[header] = (rank, snapshot, self.ticket)


def waits_for_a_slot(full: Set[int], waiting: Set[int]) -> Set[int]:
    """The ranks asked for their next commit only once the commit being assembled forms:
    each got no slab (``full``: both its slots hold a commit the driver needs) while its
    part of that commit waits for the other ranks' (``waiting``). Forming it frees the slot
    the commit before held, so the request names it; asked now, the rank's next commit would
    go to Ray's store, and so might its call-end one (a request outstanding is not asked
    again). The wait costs nothing: that next commit is an interval away, the other parts
    at most a step."""
    return full & waiting


def check_for_failure(remote_values: Sequence[Any]) -> bool:
    """Wait for every reference; False (and the error logged) if an actor died.

    Ray 1.12's ``ray.util.sgd.utils.check_for_failure``; an error raised by the
    task itself still propagates.
    """
    unfinished = list(remote_values)
    try:
        while unfinished:
            finished, unfinished = ray.wait(unfinished)
            ray.get(finished)
        return True
    except RayActorError as exc:
        logger.exception("raysgd: %s", exc)
        return False
