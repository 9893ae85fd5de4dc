"""``WorkerGroup``: the only module that creates Ray actors.

It reserves resources with a placement group, starts one actor per remote
rank in parallel (plus, with ``use_local``, rank 0 in the driver), sets up the
process group with rank 0's node as the rendezvous, fans calls out and turns
worker failures into typed errors.
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raysgd import placement
from raysgd.actor import COMMIT_WAIT_S, RemoteWorker
from raysgd.config import RankInfo, WorkerSettings
from raysgd.distributed import local_ranks
from raysgd.errors import RankFailure, ResourcesUnavailableError
from raysgd.failures import primary_failure
from raysgd.health import Commit, HealthMonitor
from raysgd.runner import WorkerRunner
from raysgd.watch import CallWatch, pull_to_driver

logger = logging.getLogger("raysgd")

# Seconds to keep collecting other ranks' errors after the first one arrives,
# so a report names the dead rank *and* the survivors it broke.
FAILURE_GRACE_S = 1.0


POLL_S = 0.1  # how often a monitored call checks health


class WorkerGroup:
    """Starts, drives and stops the workers of one trainer."""

    def __init__(self, operator_cls: type, config_for_rank: Callable[[int], dict],
                 settings: WorkerSettings, num_workers: int, use_local: bool = False,
                 initialization_hook: Optional[Callable] = None,
                 placement_timeout_s: float = 100.0,
                 reservation: Optional[placement.Reservation] = None,
                 placement_strategy: str = "PACK", workers_per_host: Optional[int] = None):
        self.operator_cls = operator_cls
        self.config_for_rank = config_for_rank
        self.settings = settings
        self.num_workers = num_workers
        self.use_local = use_local
        self.initialization_hook = initialization_hook
        self.placement_timeout_s = placement_timeout_s
        self.placement_strategy = placement_strategy  # ignored inside a reservation
        # k workers per host: one bundle of k workers' resources per host (STRICT_SPREAD).
        self.workers_per_bundle = workers_per_host or 1
        self.local_runner: Optional[WorkerRunner] = None
        self.actors: List[Any] = []
        self.reservation = reservation
        self._pg = None
        self._first_bundle = 0
        self._watches = 0  # numbers each call's commit requests
        # Set when the last call failed while other ranks were still inside it
        # (e.g. waiting in a collective the failed rank never joined).
        self.left_running = False
        self._threads: Optional[concurrent.futures.ThreadPoolExecutor] = None

    @property
    def num_remote(self) -> int:
        return self.num_workers - (1 if self.use_local else 0)

    # ----------------------------------------------------------------- start
    def start(self) -> List[Dict[str, Any]]:
        """Start every worker and run the operators' ``setup``; returns their summaries."""
        started = time.perf_counter()
        try:
            infos = self._create_workers()
            self._start_runners(infos)
            if self.num_workers > 1:
                port = self.execute_single(0, "create_store", infos[0]["host"])
                self.execute("setup_process_group", infos[0]["host"], port)
            summaries = self.execute("setup_operator")
        except BaseException:
            self.shutdown(force=True)
            raise
        logger.info("raysgd: %d worker(s) ready in %.1fs", self.num_workers,
                    time.perf_counter() - started)
        return summaries

    def _create_workers(self) -> List[Dict[str, Any]]:
        infos = []
        if self.use_local:
            infos.append(self._local_info())
        if self.num_remote:
            self._reserve()
            self.actors = [self._new_actor(i) for i in range(self.num_remote)]
            infos += self._get([a.node_info.remote() for a in self.actors], offset=len(infos))
        return infos

    def _local_info(self) -> Dict[str, Any]:
        if ray.is_initialized():
            return {"node_id": ray.get_runtime_context().get_node_id(),
                    "host": ray.util.get_node_ip_address(), "pid": os.getpid()}
        return {"node_id": "local", "host": "127.0.0.1", "pid": os.getpid()}

    def _bundle(self) -> Dict[str, float]:
        bundle = {"CPU": float(self.settings.num_cpus_per_worker)}
        if self.settings.use_gpu:
            bundle["GPU"] = float(self.settings.num_gpus_per_worker)
        return bundle

    def _bundles(self) -> List[Dict[str, float]]:
        return placement.host_bundles(self._bundle(), self.num_remote, self.workers_per_bundle)

    def _reserve(self) -> None:
        placement.ensure_ray()
        bundles = self._bundles()
        if self.reservation is not None:
            if len(bundles) > self.reservation.size:
                raise ResourcesUnavailableError(
                    f"{self.num_remote} worker(s) do not fit the {self.reservation.size} bundle(s) "
                    "reserved for them.")
            self._first_bundle = self.reservation.first_bundle
            return
        placement.check_can_ever_place(bundles[0], len(bundles), self.placement_strategy)
        self._pg = placement.reserve(bundles[0], len(bundles), self.placement_timeout_s,
                                     self.placement_strategy)

    def _new_actor(self, index: int):
        bundle = self._bundle()
        group = self.reservation.group if self.reservation is not None else self._pg
        strategy = PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=self._first_bundle + index // self.workers_per_bundle)
        return RemoteWorker.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                                     scheduling_strategy=strategy).remote()

    def _start_runners(self, infos: List[Dict[str, Any]]) -> None:
        local = local_ranks([info["node_id"] for info in infos])
        kwargs = [{"operator_cls": self.operator_cls, "config": self.config_for_rank(rank),
                   "settings": self.settings,
                   "rank": RankInfo(rank, local[rank], self.num_workers),
                   "commit_every": self.settings.commit_every}
                  for rank in range(self.num_workers)]
        remote_kwargs = kwargs[1:] if self.use_local else kwargs
        remote_extra = {"num_threads": max(1, int(self.settings.num_cpus_per_worker)),
                        "commit_wait_s": COMMIT_WAIT_S}
        refs = [actor.start.remote(self.initialization_hook, {**kw, **remote_extra})
                for actor, kw in zip(self.actors, remote_kwargs)]
        if self.use_local:
            if self.initialization_hook:
                self.initialization_hook()
            self.local_runner = WorkerRunner(**kwargs[0])
        self._get(refs, offset=1 if self.use_local else 0)

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

    # --------------------------------------------------------------- commits
    def execute_pair(self, method: str, *args, watch: Optional[CallWatch] = None):
        """Call a runner method returning (header, snapshot) on every rank.

        Returns the headers and a :class:`Commit` of the snapshots, which stay
        in the object store (owned by the driver, not on its heap).
        """
        pairs = [actor.execute_pair.remote(method, *args) for actor in self.actors]
        local_future = None
        if self.local_runner is not None:
            local_future = self._run_local(getattr(self.local_runner, method), *args)
        offset = 1 if self.local_runner is not None else 0
        headers = self._gather([h for h, _ in pairs], offset, local_future, True, watch)
        snapshots = [snap for _, snap in pairs]
        if self.local_runner is not None:
            headers[0], local_snap = headers[0]
            snapshots.insert(0, ray.put(local_snap) if ray.is_initialized() else local_snap)
        pull_to_driver(snapshots)
        return headers, Commit(headers[0]["step"], headers[0]["call_done"], self.num_workers,
                               snapshots, headers[0].get("epochs_done", 0))

    def snapshot(self) -> Commit:
        """Commit now, between calls."""
        return self.execute_pair("snapshot_pair")[1]

    def restore(self, commit: Commit) -> None:
        """Load ``commit`` into every rank (each its own part when the size is unchanged)."""
        same_size = commit.world_size == self.num_workers
        args = [(commit.snapshots[0], commit.snapshots[rank] if same_size else None)
                for rank in range(self.num_workers)]
        self.execute_per_rank("restore", args)
        logger.info("raysgd: restored the commit of step %d on %d worker(s)", commit.step,
                    self.num_workers)

    def watch(self, timeout_s: float, committed_step: int, on_commit=None,
              on_progress=None) -> CallWatch:
        self._watches += 1
        return CallWatch(self, HealthMonitor(self.num_workers, timeout_s), committed_step,
                         on_commit, ticket=self._watches, on_progress=on_progress)

    def placeable_workers(self, want: int = 0) -> int:
        """Workers of this group's shape that fit in the cluster now (remote ones)."""
        if not ray.is_initialized():
            return 0
        if self.reservation is not None:
            return self.reservation.size  # ours alone; a dead worker's bundle comes back
        return placement.placeable_workers(self._bundle(), want=want)

    @staticmethod
    def cluster_gpus() -> float:
        return placement.cluster_gpus()

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
        if failures and abort_on_failure:
            # Survivors may be stuck in a collective: take what arrives within
            # the grace period; ranks still inside the call are left_running, and
            # the caller replaces the group (a restart) instead of reusing it.
            self._collect_stragglers(pending, local_future, results, failures)
            self.left_running = bool(pending) or (local_future is not None
                                                  and not local_future.done())
            self._probe_liveness(failures, watch)
        elif failures:
            for ref, rank in pending.items():
                self._collect(ref, rank, results, failures)
        if local_future is not None and not failures:
            self._wait_local(local_future, watch, results, failures)
        if failures:
            raise primary_failure(failures)
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
        ready, _ = ray.wait(list(probes), num_returns=len(probes), timeout=FAILURE_GRACE_S * 2)
        for ref in ready:
            try:
                report = ray.get(ref)
                if watch is not None:
                    watch.monitor.observe(probes[ref], report)
            except RayActorError as err:
                failures.append(RankFailure(probes[ref], err, str(err), died=True))

    # --------------------------------------------------------------- shutdown
    def shutdown(self, force: bool = False) -> None:
        """Stop every worker; with ``force`` kill them without a clean teardown (and without
        waiting for Ray to show their resources free again: recovery must not wait for a
        lost node's resources)."""
        wait_for_release = self._pg is not None and not force
        available = ray.available_resources() if wait_for_release else {}
        if not force and self.actors:
            try:
                ray.get([a.execute.remote("shutdown") for a in self.actors], timeout=10)
            except (RayActorError, RayTaskError, GetTimeoutError):
                logger.warning("raysgd: a worker did not shut down cleanly; killing it")
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.local_runner is not None:
            self.local_runner.shutdown()
            self.local_runner = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        if self._pg is not None:
            freed = {key: sum(b[key] for b in self._bundles()) for key in self._bundle()}
            placement.release(self._pg, {k: available.get(k, 0.0) + v for k, v in freed.items()}
                              if wait_for_release else None)
            self._pg = None

