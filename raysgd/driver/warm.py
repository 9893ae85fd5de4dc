"""Warm worker processes on Ray: where a worker lives, idle crews, spares.

The Ray side of :mod:`raysgd.driver.pool` (which only keeps the books); the worker
group calls these to create, adopt and stop actors.

Where a worker process lives decides whether it can outlive its trainer:

* :class:`BesideBundles` (CPU workers): the placement group reserves the CPUs
  and each worker is a zero-resource actor pinned to its bundle's node.
  Removing the group frees the CPUs and leaves the process running, so an idle
  crew reserves nothing and a legacy script that checks the CPUs after
  ``shutdown()`` finds them free.
* :class:`InBundles` (GPU workers): Ray makes GPUs visible only to an actor
  that holds them, so the worker lives in its bundle, and its idle crew keeps
  the placement group until it is reused, reaped or another trainer needs room.
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

from raysgd.config import WorkerSettings
from raysgd.driver import placement
from raysgd.driver.pool import POOL, Crew, code_fits, seat
from raysgd.worker.actor import RemoteWorker
from raysgd.worker.process_start import ProcessStart

logger = logging.getLogger("raysgd")

PROBE_S = 5.0  # how long an idle crew may take to answer before it is replaced
# How long recovery waits for a spare's process to answer; one that does not (not placed,
# or still starting) is passed over for a new process.
SPARE_PROBE_S = 1.0


class BesideBundles:
    """CPU workers: zero-resource actors on their bundles' nodes; the group holds the CPUs.
    ``start``: how its processes run from their start (``raysgd.worker.process_start``)."""

    keeps_group = False

    def __init__(self, start: ProcessStart = ProcessStart()):
        self.start = start

    def actor(self, group: Any, index: int, bundle: Dict[str, float], node: str):
        return RemoteWorker.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            **self.start.actor_options()).remote(False, self.start)

    def spare(self, node: str):
        # On its planned node exactly: Ray may put a zero-resource actor with soft affinity
        # on any node, the ranks' own included, where a lost node would take it with them.
        return _spare_on(node, self.start)


class InBundles:
    """GPU workers: actors inside their bundles, holding the GPUs Ray then shows them."""

    keeps_group = True

    def __init__(self, gpus_per_worker: float, start: ProcessStart = ProcessStart()):
        self.gpus = gpus_per_worker
        self.start = start

    def actor(self, group: Any, index: int, bundle: Dict[str, float], node: str):
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        return RemoteWorker.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                                    scheduling_strategy=strategy,
                                    **self.start.actor_options()).remote(False, self.start)

    def spare(self, node: str):
        # A spare holds no GPU while idle and starts no CUDA while warming; when it takes a
        # rank it uses the dead rank's device, which the rank's bundle still reserves
        # (_WorkerActor.use_devices).
        # On its node exactly: it can only take a rank there (the device ids are the node's).
        return _spare_on(node, self.start)


def _spare_on(node: str, start: ProcessStart):
    """A spare's process on ``node`` exactly, holding no CPU and no GPU. One whose node died
    before it started fails to start, and the next commit replaces it."""
    strategy = NodeAffinitySchedulingStrategy(node, soft=False)
    return RemoteWorker.options(num_cpus=0, num_gpus=0, scheduling_strategy=strategy,
                                **start.actor_options()).remote(True, start)


def residence(settings: WorkerSettings, start: ProcessStart = ProcessStart()):
    """Where this trainer's workers live (decided once, from ``use_gpu``), and how its
    processes run from their start."""
    return InBundles(settings.num_gpus_per_worker, start) if settings.use_gpu \
        else BesideBundles(start)


@dataclass(eq=False)
class Spare:
    """A warm process waiting to take a dead rank's place on ``node``; ``ready`` resolves
    once it is warm, to the node it runs on, which ``node`` then says."""

    actor: Any
    ready: Any
    node: str = ""

    def failed(self) -> bool:
        """Died before or while warming up (it is then replaced)."""
        return self._outcome() is False

    def node_now(self) -> str:
        """``node``, read again from ``ready`` if the spare has warmed up since."""
        self._outcome()
        return self.node

    def _outcome(self) -> Optional[bool]:
        done, _ = ray.wait([self.ready], timeout=0)
        if not done:
            return None
        try:
            node = ray.get(done[0])
            self.node = node if isinstance(node, str) and node else self.node
            return True
        except RayError:  # died, or never placed (its node died before it started)
            return False


def usable_spares(spares: List[Spare], count: int) -> List[Spare]:
    """Up to ``count`` of ``spares`` that can take a rank now: warm ones first, then ones
    whose process answers within ``SPARE_PROBE_S`` while still warming up (a rank's start
    waits for the warm-up, which is further along than a new process would be). A spare
    Ray has not placed or started is passed over."""
    ready = [spare for spare in spares if spare._outcome() is True][:count]
    rest = [spare for spare in spares if spare not in ready and spare._outcome() is None]
    if len(ready) >= count or not rest:
        return ready
    probes = [spare.actor.progress.remote() for spare in rest]
    ray.wait(probes, num_returns=len(probes), timeout=SPARE_PROBE_S)
    for spare, probe in zip(rest, probes):
        try:
            if len(ready) < count and ray.get(probe, timeout=0) is not None:
                ready.append(spare)
        except RayError:  # dead, unplaceable, or not answering in time
            pass
    return ready


def start_spares(residence_: Any, operator_cls: type, nodes: List[str]) -> List[Spare]:
    """One spare on each of ``nodes`` (see ``raysgd.driver.spare_plan``), not waited for."""
    actors = [residence_.spare(node) for node in nodes]
    # Pickled here, so the spare's warm-up imports the operator's module, not Ray's
    # argument handling before it.
    blob = ray.cloudpickle.dumps(operator_cls)
    return [Spare(actor, actor.warm.remote(blob), node) for actor, node in zip(actors, nodes)]


def code_stamp(cls: type) -> tuple:
    """The file (and its modification time) of ``cls``'s module. Workers import that module
    once; after it is edited (a notebook's helper module), new processes must run it."""
    module = sys.modules.get(cls.__module__)
    path = getattr(module, "__file__", None)
    try:
        return (cls.__module__, path, os.stat(path).st_mtime_ns) if path else (cls.__module__,)
    except OSError:
        return (cls.__module__, path)


def take_crew(key: tuple, spares: int) -> Optional[Tuple[tuple, List[dict]]]:
    """An idle GPU crew of ``key``: ``((its workers, up to spares of its spares, its placement
    group), their node infos)``, or None (a crew that does not answer is stopped)."""
    crew = POOL.take(placement.ray_session(), key)
    if crew is None:
        return None
    try:
        infos = ray.get([a.node_info.remote() for a in crew.actors], timeout=PROBE_S)
    except (RayActorError, GetTimeoutError) as exc:
        logger.warning("raysgd: an idle worker is gone (%s); starting new ones", exc)
        stop_crew(crew)
        return None
    logger.info("raysgd: reusing %d warm worker(s) (pids %s)", len(infos),
                [info["pid"] for info in infos])
    for spare in crew.spares[spares:]:  # this trainer wants fewer
        kill(spare.actor)
    return (crew.actors, crew.spares[:spares], crew.group), infos


def beside_key(start: ProcessStart) -> tuple:
    """The key of idle crews of CPU workers: zero-resource processes, which any CPU trainer
    can seat on its bundles' nodes, whatever its worker count and resources per worker, if
    they started with its allocator (niceness is set at every seat)."""
    return ("beside bundles", start.allocator())


@dataclass
class Taken:
    """Idle processes a CPU trainer took: one per seat (None: start one there), spares, and
    the operators' modules those processes imported (their code stamps)."""

    seated: List[Any]
    spares: List[Spare]
    code: Dict[str, tuple]


def take_beside(nodes: List[str], spares: int, operator_cls: type, key: tuple) -> Taken:
    """Seat idle CPU processes of this driver on ``nodes`` (one per worker), keep up to
    ``spares`` of the others as spares (idle spares first), and give the rest back to the
    pool. Processes that imported an older version of the operator's module are stopped.
    ``key``: the trainer's ``beside_key``."""
    session, stamp = placement.ray_session(), code_stamp(operator_cls)
    POOL.release_idle(lambda crew: crew.key == key and not code_fits(crew.code, stamp))
    crews = POOL.take_all(session, lambda crew: crew.key == key)
    code = {name: s for crew in crews for name, s in crew.code.items()}
    answering = _answering([a for crew in crews for a in crew.actors])
    node_of = {id(actor): node for actor, node in answering}
    seated, left = seat(nodes, answering)
    idle_spares = [spare for crew in crews for spare in crew.spares]
    for spare in [spare for spare in idle_spares if spare.failed()]:
        kill(spare.actor)
        idle_spares.remove(spare)
    kept, extra = idle_spares[:spares], idle_spares[spares:]
    if len(kept) < spares and left:
        blob = ray.cloudpickle.dumps(operator_cls)
        more, left = left[:spares - len(kept)], left[spares - len(kept):]
        kept += [Spare(actor, actor.warm.remote(blob), node_of[id(actor)]) for actor in more]
    if left or extra:
        POOL.give(Crew(session, key, left, extra, None, code=dict(code),
                       stop=stop_crew))
    reused = sum(actor is not None for actor in seated)
    if reused or kept:
        logger.info("raysgd: reusing %d warm worker(s) and %d spare(s); starting %d",
                    reused, len(kept), len(seated) - reused)
    return Taken(seated, kept, {**code, stamp[0]: stamp})


def _answering(actors: List[Any]) -> List[Tuple[Any, str]]:
    """``(actor, its node)`` for the idle ``actors`` that answer in time; the others are
    killed (one that died while idle is replaced, not waited for)."""
    refs = [actor.node_info.remote() for actor in actors]
    ray.wait(refs, num_returns=len(refs), timeout=PROBE_S)
    answering = []
    for actor, ref in zip(actors, refs):
        try:
            answering.append((actor, ray.get(ref, timeout=0)["node_id"]))
        except (RayActorError, RayTaskError, GetTimeoutError) as exc:
            logger.warning("raysgd: an idle worker process is gone or does not answer (%s); "
                           "not reusing it", type(exc).__name__)
            kill(actor)
    return answering


def stop_crew(crew: Crew) -> None:
    """Kill an idle crew's actors and remove the placement group it keeps."""
    if not ray.is_initialized() or crew.session != placement.ray_session():
        return  # their Ray session ended, and they with it
    for actor in crew.actors + [spare.actor for spare in crew.spares]:
        kill(actor)
    if crew.group is not None:
        placement.release(crew.group)


def kill(actor: Any) -> None:
    """Kill ``actor``; one that is already gone is fine."""
    try:
        ray.kill(actor, no_restart=True)
    except Exception as exc:  # noqa: BLE001 - stopping the rest matters more
        logger.debug("raysgd: kill of %s failed: %r", actor, exc)


def idle_workers() -> Dict[str, Any]:
    """This driver's idle warm workers: ``{"workers": n, "reserved": {"CPU": ...}}``
    (only GPU workers keep a reservation while idle)."""
    if not ray.is_initialized():
        POOL.release_idle()  # their Ray is gone, and they with it
        return {"workers": 0, "reserved": {}}
    session = placement.ray_session()
    return {"workers": POOL.idle_workers(session), "reserved": POOL.held(session)}


def release_idle_workers() -> int:
    """Stop this driver's idle warm workers now (they also stop after
    ``RAYSGD_IDLE_WORKER_TIMEOUT_S`` seconds idle, and at exit); returns how many."""
    return POOL.release_idle()
