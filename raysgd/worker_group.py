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
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raysgd.config import RankInfo, WorkerSettings
from raysgd.distributed import local_ranks
from raysgd.errors import RankFailure, ResourcesUnavailableError, WorkerFailedError
from raysgd.failures import primary_failure
from raysgd.runner import WorkerRunner

logger = logging.getLogger("raysgd")

# Seconds to keep collecting other ranks' errors after the first one arrives,
# so a report names the dead rank *and* the survivors it broke.
FAILURE_GRACE_S = 1.0


class _WorkerActor:
    """Thin actor around a :class:`WorkerRunner`; tags errors with the rank."""

    def __init__(self):
        self.runner: Optional[WorkerRunner] = None
        self.rank = -1

    def node_info(self) -> Dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "host": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def start(self, init_hook, runner_kwargs: Dict[str, Any]) -> None:
        self.rank = runner_kwargs["rank"].world_rank
        if init_hook is not None:
            self.execute_fn(init_hook)
        self.runner = WorkerRunner(**runner_kwargs)

    def execute(self, method: str, *args, **kwargs) -> Any:
        return self.execute_fn(getattr(self.runner, method), *args, **kwargs)

    def execute_fn(self, fn: Callable, *args, **kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            exc.add_note(f"[raysgd] raised on rank {self.rank} (pid {os.getpid()})")
            raise


_RemoteWorker = ray.remote(_WorkerActor)


class WorkerGroup:
    """Starts, drives and stops the workers of one trainer."""

    def __init__(self, operator_cls: type, config_for_rank: Callable[[int], dict],
                 settings: WorkerSettings, num_workers: int, use_local: bool = False,
                 initialization_hook: Optional[Callable] = None,
                 placement_timeout_s: float = 60.0):
        self.operator_cls = operator_cls
        self.config_for_rank = config_for_rank
        self.settings = settings
        self.num_workers = num_workers
        self.use_local = use_local
        self.initialization_hook = initialization_hook
        self.placement_timeout_s = placement_timeout_s
        self.local_runner: Optional[WorkerRunner] = None
        self.actors: List[Any] = []
        self.pids: List[int] = []
        self._pg = None
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
        self.pids = [info["pid"] for info in infos]
        return infos

    def _local_info(self) -> Dict[str, Any]:
        if ray.is_initialized():
            return {"node_id": ray.get_runtime_context().get_node_id(),
                    "host": ray.util.get_node_ip_address(), "pid": os.getpid()}
        return {"node_id": "local", "host": "127.0.0.1", "pid": os.getpid()}

    def _bundle(self) -> Dict[str, float]:
        bundle = {"CPU": float(self.settings.num_cpus_per_worker)}
        if self.settings.use_gpu:
            bundle["GPU"] = 1.0
        return bundle

    def _reserve(self) -> None:
        ensure_ray()
        check_can_ever_place(self._bundle(), self.num_remote)
        self._pg = placement_group([self._bundle()] * self.num_remote, strategy="PACK")
        ready, _ = ray.wait([self._pg.ready()], timeout=self.placement_timeout_s)
        if not ready:
            remove_placement_group(self._pg)
            self._pg = None
            raise ResourcesUnavailableError(
                f"Could not place {self.num_remote} worker(s) of {self._bundle()} within "
                f"{self.placement_timeout_s:.0f}s; available now: {_resources(ray.available_resources())}, "
                f"cluster total: {_resources(ray.cluster_resources())}. Free resources, lower "
                "num_workers/num_cpus_per_worker, or raise placement_timeout_s.")

    def _new_actor(self, index: int):
        bundle = self._bundle()
        strategy = PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=index)
        return _RemoteWorker.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                                     scheduling_strategy=strategy).remote()

    def _start_runners(self, infos: List[Dict[str, Any]]) -> None:
        local = local_ranks([info["node_id"] for info in infos])
        kwargs = [{"operator_cls": self.operator_cls, "config": self.config_for_rank(rank),
                   "settings": self.settings,
                   "rank": RankInfo(rank, local[rank], self.num_workers)}
                  for rank in range(self.num_workers)]
        remote_kwargs = kwargs[1:] if self.use_local else kwargs
        refs = [actor.start.remote(self.initialization_hook,
                                   {**kw, "num_threads": max(1, int(self.settings.num_cpus_per_worker))})
                for actor, kw in zip(self.actors, remote_kwargs)]
        if self.use_local:
            if self.initialization_hook:
                self.initialization_hook()
            self.local_runner = WorkerRunner(**kwargs[0])
        self._get(refs, offset=1 if self.use_local else 0)

    # ---------------------------------------------------------------- fan-out
    def execute(self, method: str, *args, abort_on_failure: bool = True, **kwargs) -> List[Any]:
        """Call ``runner.method(*args)`` on every rank; results in rank order."""
        return self.execute_per_rank(method, [args] * self.num_workers,
                                     abort_on_failure=abort_on_failure, **kwargs)

    def execute_per_rank(self, method: str, args_per_rank: Sequence[tuple],
                         abort_on_failure: bool = True, **kwargs) -> List[Any]:
        offset = 1 if self.use_local else 0
        refs = [actor.execute.remote(method, *args_per_rank[i + offset], **kwargs)
                for i, actor in enumerate(self.actors)]
        local_future = None
        if self.local_runner is not None:
            args = [ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args_per_rank[0]]
            local_future = self._run_local(getattr(self.local_runner, method), *args, **kwargs)
        return self._gather(refs, offset, local_future, abort_on_failure)

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

    def _gather(self, refs: list, offset: int, local_future, abort_on_failure: bool) -> List[Any]:
        results: List[Any] = [None] * (len(refs) + offset)
        failures: List[RankFailure] = []
        pending = {ref: i + offset for i, ref in enumerate(refs)}
        while pending and not failures:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5 if local_future else None)
            for ref in ready:
                self._collect(ref, pending.pop(ref), results, failures)
            if local_future is not None and local_future.done():
                self._collect_local(local_future, results, failures)
                local_future = None
        if failures and abort_on_failure:
            # Survivors may be stuck in a collective: take what arrives within
            # the grace period; the caller tears the group down.
            self._collect_stragglers(pending, local_future, results, failures)
        elif failures:
            for ref, rank in pending.items():
                self._collect(ref, rank, results, failures)
        if local_future is not None and not failures:
            self._collect_local(local_future, results, failures, wait=True)
        if failures:
            raise primary_failure(failures)
        return results

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

    # --------------------------------------------------------------- shutdown
    def shutdown(self, force: bool = False) -> None:
        """Stop every worker; with ``force`` kill them without a clean teardown."""
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
            remove_placement_group(self._pg)
            self._pg = None


def _resources(resources: Dict[str, float]) -> Dict[str, float]:
    return {k: v for k, v in resources.items() if k in ("CPU", "GPU", "memory") or k.startswith("TPU")}


def check_can_ever_place(bundle: Dict[str, float], count: int) -> None:
    """Fail at once when the cluster could never hold ``count`` bundles."""
    total = ray.cluster_resources()
    for key, amount in bundle.items():
        if amount * count > total.get(key, 0):
            raise ResourcesUnavailableError(
                f"Requested {count} worker(s) with {bundle} each ({key}: {amount * count:g} in all), "
                f"but the whole cluster has {key}: {total.get(key, 0):g}. Lower num_workers or "
                "num_cpus_per_worker, set use_gpu=False, or add nodes.")
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if nodes and not any(all(n.get(k, 0) >= v for k, v in bundle.items()) for n in nodes):
        raise ResourcesUnavailableError(
            f"No node can hold one worker of {bundle}; the largest nodes have "
            f"{[_resources(n) for n in nodes]}. Lower num_cpus_per_worker.")


def ensure_ray() -> None:
    """Start an embedded local Ray unless the user already called ``ray.init``."""
    if not ray.is_initialized():
        logger.info("raysgd: ray.init() with defaults (call ray.init(address='auto') "
                    "first to join a cluster)")
        ray.init()


def cluster_gpus() -> float:
    ensure_ray()
    return ray.cluster_resources().get("GPU", 0.0)
