"""Calls fanned out to every rank, and their outcomes gathered into results or one error.

The calling half of :class:`raysgd.driver.worker_group.WorkerGroup` (which mixes this
in and owns ``actors``, ``local_runner`` and ``use_local``). After the first
failure the other ranks get ``FAILURE_GRACE_S`` to report, and every live
actor's control thread is probed, because death notices can lag behind the
survivors' collective errors; ``failures.primary_failure`` then picks the
error to raise.
"""
from __future__ import annotations

import concurrent.futures
import time
from typing import Any, Callable, List, Optional, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from raysgd.driver import placement
from raysgd.driver.failures import is_collective_error, primary_failure
from raysgd.driver.watch import CallWatch
from raysgd.errors import RankFailure, WorkerFailedError

# Seconds to keep collecting other ranks' errors after the first one arrives,
# so a report names the dead rank *and* the survivors it broke.
FAILURE_GRACE_S = 1.0
POLL_S = 0.1  # how often a monitored call checks health


def _drop(pending: dict, lost: List[RankFailure]) -> List[RankFailure]:
    """Take the ``lost`` ranks' calls out of ``pending`` (ref -> rank); returns ``lost``."""
    ranks = {f.rank for f in lost}
    for ref in [ref for ref, rank in pending.items() if rank in ranks]:
        del pending[ref]
    return lost


def _stamped(error: BaseException, watch: Optional[CallWatch]) -> BaseException:
    """``error``, a worker failure told when its dead ranks last answered the driver."""
    if isinstance(error, WorkerFailedError) and watch is not None:
        error.last_seen = watch.monitor.last_seen(sorted({f.rank for f in error.failures
                                                          if f.died}))
    return error


class FanOut:
    """Fan-out and failure gathering over ``self.actors`` (+ ``self.local_runner``)."""

    actors: List[Any]
    local_runner: Any
    use_local: bool
    num_workers: int
    left_running: bool
    _nodes: List[str]
    _threads: Optional[concurrent.futures.ThreadPoolExecutor]

    # ---------------------------------------------------------------- fan-out
    def execute(self, method: str, *args, abort_on_failure: bool = True,
                watch: Optional[CallWatch] = None, **kwargs) -> List[Any]:
        """Call ``runner.method(*args)`` on every rank; results in rank order.

        With a ``watch`` the call is health-checked and collects in-epoch commits.
        """
        return self.execute_per_rank(method, [args] * self.num_workers,
                                     abort_on_failure=abort_on_failure, watch=watch, **kwargs)

    def execute_per_rank(self, method: str, args_per_rank: Sequence[tuple],
                         abort_on_failure: bool = True, watch: Optional[CallWatch] = None,
                         **kwargs) -> List[Any]:
        offset = 1 if self.use_local else 0
        refs = [actor.execute.remote(method, *args_per_rank[i + offset], **kwargs)
                for i, actor in enumerate(self.actors)]
        local_future = None
        if self.local_runner is not None:
            args = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args_per_rank[0]]
            local_future = self._run_local(getattr(self.local_runner, method), *args, **kwargs)
        return self._gather(refs, offset, local_future, abort_on_failure, watch)

    def put(self, obj: Any) -> Any:
        """Store ``obj`` once so every remote worker reads the same copy."""
        return ray.put(obj) if self.actors else obj

    def execute_single(self, rank: int, method: str, *args, **kwargs) -> Any:
        if self.use_local and rank == 0:
            return getattr(self.local_runner, method)(*args, **kwargs)
        actor = self.actors[rank - (1 if self.use_local else 0)]
        return self._get([actor.execute.remote(method, *args, **kwargs)], offset=rank,
                         abort_on_failure=False)[0]

    def _run_local(self, fn: Callable, *args, **kwargs) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self.actors:  # alone: run in the caller's thread so debuggers work
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)
            return future
        # With remote peers, rank 0 runs in a thread so the driver keeps
        # watching the peers and can abort a collective one of them broke.
        if self._threads is None:
            self._threads = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="raysgd-rank0")
        return self._threads.submit(fn, *args, **kwargs)

    def _get(self, refs: list, offset: int, abort_on_failure: bool = True) -> List[Any]:
        return self._gather(refs, offset, None, abort_on_failure)[offset:]

    def _gather(self, refs: list, offset: int, local_future, abort_on_failure: bool,
                watch: Optional[CallWatch] = None) -> List[Any]:
        results: List[Any] = [None] * (len(refs) + offset)
        failures: List[RankFailure] = []
        self.left_running = False
        pending = {ref: i + offset for i, ref in enumerate(refs)}
        polling = local_future is not None or watch is not None
        while pending and not failures:
            wake = watch.wake_refs() if watch is not None else []
            ready, _ = ray.wait(list(pending) + wake, num_returns=1,
                                timeout=POLL_S if polling else None)
            for ref in ready:
                if ref in pending:
                    self._collect(ref, pending.pop(ref), results, failures)
            if local_future is not None and local_future.done():
                self._collect_local(local_future, results, failures)
                local_future = None
            if watch is not None and not failures:
                watch.tick()
                failures += _drop(pending, watch.lost_ranks())
        if failures and abort_on_failure:
            # Survivors may be stuck in a collective: take what arrives within
            # the grace period; ranks still inside the call are left_running, and
            # the caller replaces the group (a restart) instead of reusing it.
            if any(f.died or is_collective_error(f.error) for f in failures):
                self._drop_lost(pending, failures)  # a worker failure: were nodes lost?
            self._collect_stragglers(pending, local_future, results, failures)
            self._probe_liveness(failures, watch)
            # A rank whose call never returned because its node died is not running.
            dead = {f.rank for f in failures if f.died}
            self.left_running = bool(set(pending.values()) - dead) or (
                local_future is not None and not local_future.done())
        elif failures:
            for ref, rank in pending.items():
                self._collect(ref, rank, results, failures)
        if local_future is not None and not failures:
            self._wait_local(local_future, watch, results, failures)
        if failures:
            raise _stamped(primary_failure(failures), watch)
        return results

    def _wait_local(self, future, watch, results, failures) -> None:
        while watch is not None and not future.done():
            try:
                future.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                watch.tick()
            except BaseException:  # noqa: BLE001 - collected just below
                break
        self._collect_local(future, results, failures, wait=True)

    def _collect(self, ref, rank: int, results: list, failures: List[RankFailure]) -> None:
        try:
            results[rank] = ray.get(ref)
        except RayTaskError as err:
            cause = err.cause if isinstance(err.cause, BaseException) else err
            failures.append(RankFailure(rank, cause, str(err)))
        except RayActorError as err:
            failures.append(RankFailure(rank, err, str(err), died=True))

    def _collect_local(self, future, results: list, failures: List[RankFailure],
                       wait: bool = False) -> None:
        try:
            results[0] = future.result() if wait or future.done() else None
        except BaseException as exc:  # noqa: BLE001 - user code may raise anything
            exc.add_note("[raysgd] raised on rank 0 (driver, use_local=True)")
            failures.append(RankFailure(0, exc))

    def _collect_stragglers(self, pending: dict, local_future, results, failures) -> None:
        deadline = time.monotonic() + FAILURE_GRACE_S
        if pending:
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=FAILURE_GRACE_S)
            for ref in ready:
                self._collect(ref, pending.pop(ref), results, failures)
        if local_future is not None:
            try:
                local_future.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                pass
            except BaseException as exc:  # noqa: BLE001
                failures.append(RankFailure(0, exc))

    def _drop_lost(self, pending: dict, failures: List[RankFailure]) -> None:
        """Every rank whose node died is dead, whatever it answered: one still inside the
        call is no straggler (its call would hang until Ray's health checks give the node
        up, seconds later), and one that raised a collective error or still answers is
        going too (a node's processes exit one by one after its raylet)."""
        known = {f.rank for f in failures if f.died}
        lost = self.on_lost_nodes([rank for rank in range(len(self._nodes)) if rank not in known])
        failures += lost
        _drop(pending, lost)

    def _probe_liveness(self, failures: List[RankFailure], watch: Optional[CallWatch]) -> None:
        """Group state: a worker that died makes every other error its consequence.

        Death notices can lag behind the survivors' collective errors, so ask
        each worker directly (its control thread answers even mid-collective).
        The survivors' answers also tell the watch how far training got.
        """
        offset = 1 if self.use_local else 0
        known = {f.rank for f in failures if f.died}
        probes = {actor.progress.remote(): i + offset for i, actor in enumerate(self.actors)
                  if i + offset not in known}
        ready, unanswered = ray.wait(list(probes), num_returns=len(probes),
                                     timeout=FAILURE_GRACE_S * 2)
        for ref in ready:
            try:
                report = ray.get(ref)
                if watch is not None:
                    watch.monitor.observe(probes[ref], report)
            except RayActorError as err:
                failures.append(RankFailure(probes[ref], err, str(err), died=True))
        failures += self.on_lost_nodes([probes[ref] for ref in unanswered])

    def on_lost_nodes(self, ranks: List[int]) -> List[RankFailure]:
        """Those of ``ranks`` whose node died a moment ago, as failures: Ray lists such a
        node alive until its health checks fail, seconds later, and calls to its ranks hang
        till then; they are dead, not busy, and the group can replace them with the others
        staying."""
        nodes = {rank: self._nodes[rank] for rank in ranks if rank < len(self._nodes)}
        lost = placement.unreachable_nodes(set(nodes.values()))
        failures = []
        for rank, node in nodes.items():
            if node in lost:
                error = ConnectionError(f"node {node[:12]} is unreachable: its raylet refuses "
                                        "connections")
                failures.append(RankFailure(rank, error, str(error), died=True))
        return failures
