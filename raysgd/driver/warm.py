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
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import (NodeAffinitySchedulingStrategy,
                                            PlacementGroupSchedulingStrategy)

from raysgd.config import WorkerSettings
from raysgd.driver import placement
from raysgd.driver.pool import POOL, Crew, code_fits, seat
from raysgd.worker.actor import RemoteWorker

logger = logging.getLogger("raysgd")

PROBE_S = 5.0  # how long an idle crew may take to answer before it is replaced
# How long recovery waits for a spare that is still warming up. New processes for every rank
# take longer than that, and a spare Ray cannot place (no room) must not hold recovery up.
SPARE_WAIT_S = 3.0
# How much longer it waits for a spare whose process runs but is still warming up: its warm-up
# runs at idle priority, so while every rank trained it may have had little CPU; the dead rank's
# core is free now, and what is left of its imports takes less than new processes for every
# rank (which import everything from scratch) would.
SPARE_WARMING_WAIT_S = 20.0


class BesideBundles:
    """CPU workers: zero-resource actors on their bundles' nodes; the group holds the CPUs."""

    keeps_group = False

    def actor(self, group: Any, index: int, bundle: Dict[str, float], node: str):
        return RemoteWorker.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()

    def spare(self, node: str):
        return RemoteWorker.options(num_cpus=0, scheduling_strategy=_near(node)).remote(True)


class InBundles:
    """GPU workers: actors inside their bundles, holding the GPUs Ray then shows them."""

    keeps_group = True

    def __init__(self, gpus_per_worker: float):
        self.gpus = gpus_per_worker

    def actor(self, group: Any, index: int, bundle: Dict[str, float], node: str):
        strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        return RemoteWorker.options(num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0),
                                    scheduling_strategy=strategy).remote()

    def spare(self, node: str):
        # A spare must see a GPU to take a GPU rank, so it holds one (outside the group).
        return RemoteWorker.options(num_cpus=0, num_gpus=self.gpus,
                                    scheduling_strategy=_near(node)).remote(True)


def residence(settings: WorkerSettings):
    """Where this trainer's workers live (decided once, from ``use_gpu``)."""
    return InBundles(settings.num_gpus_per_worker) if settings.use_gpu else BesideBundles()


def _near(node: str):
    return NodeAffinitySchedulingStrategy(node, soft=True)


@dataclass
class Spare:
    """A warm process waiting to take a dead rank's place; ``ready`` resolves once it is warm."""

    actor: Any
    ready: Any

    def is_ready(self, wait_s: float = 0.0) -> bool:
        """Warm and alive as far as Ray knows, waiting up to ``wait_s`` for one still starting."""
        if wait_s > 0:
            ray.wait([self.ready], timeout=wait_s)
        return self._outcome() is True

    def is_running(self, wait_s: float = 1.0) -> bool:
        """Whether the spare's process runs: its control thread answers while the warm-up
        holds the main one (a spare Ray has not placed or started does not)."""
        done, _ = ray.wait([self.actor.progress.remote()], timeout=wait_s)
        try:
            return bool(done) and ray.get(done[0]) is not None
        except (RayActorError, RayTaskError):
            return False

    def failed(self) -> bool:
        """Died before or while warming up (it is then replaced)."""
        return self._outcome() is False

    def _outcome(self) -> Optional[bool]:
        done, _ = ray.wait([self.ready], timeout=0)
        if not done:
            return None
        try:
            ray.get(done[0])  # what the warm-up ran at (see _WorkerActor.warm)
            return True
        except (RayActorError, RayTaskError):
            return False


def ready_spares(spares: List[Spare], count: int) -> List[Spare]:
    """Up to ``count`` of ``spares`` that are warm: any ready within ``SPARE_WAIT_S``, then,
    if too few, any whose process runs and that finish warming within
    ``SPARE_WARMING_WAIT_S``."""
    ready: List[Spare] = []
    for wait_s, candidates in ((SPARE_WAIT_S, spares), (SPARE_WARMING_WAIT_S, None)):
        if candidates is None:  # second round: only the ones already running
            candidates = [spare for spare in spares if spare not in ready and spare.is_running()]
        deadline = time.monotonic() + wait_s
        for spare in candidates:
            if len(ready) < count and spare not in ready and \
                    spare.is_ready(max(0.0, deadline - time.monotonic())):
                ready.append(spare)
        if len(ready) >= count:
            break
    return ready


def start_spares(count: int, residence_: Any, operator_cls: type, nodes: List[str]) -> List[Spare]:
    """``count`` spares, not waited for, on the group's own nodes (its bundles, so a Tune
    trial's spare runs where the trial's resources are), other than rank 0's when the group
    spans several (a lost rank-0 node then does not take them too)."""
    others = sorted(set(nodes) - {nodes[0]})
    node = others[0] if others else nodes[0]
    actors = [residence_.spare(node) for _ in range(count)]
    # Pickled here so that the spare unpickles (imports) it in its low-priority warm-up.
    blob = ray.cloudpickle.dumps(operator_cls)
    return [Spare(actor, actor.warm.remote(blob)) for actor in actors]


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


# The key of every idle crew of CPU workers: zero-resource processes, which any CPU trainer
# can seat on its bundles' nodes, whatever its worker count and resources per worker.
BESIDE_KEY = ("beside bundles",)


@dataclass
class Taken:
    """Idle processes a CPU trainer took: one per seat (None: start one there), spares, and
    the operators' modules those processes imported (their code stamps)."""

    seated: List[Any]
    spares: List[Spare]
    code: Dict[str, tuple]


def take_beside(nodes: List[str], spares: int, operator_cls: type) -> Taken:
    """Seat idle CPU processes of this driver on ``nodes`` (one per worker), keep up to
    ``spares`` of the others as spares (idle spares first), and give the rest back to the
    pool. Processes that imported an older version of the operator's module are stopped."""
    session, stamp = placement.ray_session(), code_stamp(operator_cls)
    POOL.release_idle(lambda crew: crew.key == BESIDE_KEY and not code_fits(crew.code, stamp))
    crews = POOL.take_all(session, lambda crew: crew.key == BESIDE_KEY)
    code = {name: s for crew in crews for name, s in crew.code.items()}
    seated, left = seat(nodes, _answering([a for crew in crews for a in crew.actors]))
    idle_spares = [spare for crew in crews for spare in crew.spares]
    for spare in [spare for spare in idle_spares if spare.failed()]:
        kill(spare.actor)
        idle_spares.remove(spare)
    kept, extra = idle_spares[:spares], idle_spares[spares:]
    if len(kept) < spares and left:
        blob = ray.cloudpickle.dumps(operator_cls)
        more, left = left[:spares - len(kept)], left[spares - len(kept):]
        kept += [Spare(actor, actor.warm.remote(blob)) for actor in more]
    if left or extra:
        POOL.give(Crew(session, BESIDE_KEY, left, extra, None, code=dict(code),
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
