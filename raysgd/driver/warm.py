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
from raysgd.driver.pool import POOL, Crew
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


def take_crew(key: tuple, nodes: Optional[List[str]]) -> Optional[Tuple[Crew, List[dict]]]:
    """An idle crew of ``key``, its actors ordered to sit on ``nodes`` (one per worker; None:
    the crew brings its own placement group), with their node infos; or None.

    Idle crews that do not fit are stopped: this driver has moved on to another shape.
    """
    crew = POOL.take(placement.ray_session(), key)
    if crew is None:
        POOL.release_idle()
        return None
    try:
        infos = ray.get([a.node_info.remote() for a in crew.actors], timeout=PROBE_S)
    except (RayActorError, GetTimeoutError) as exc:
        logger.warning("raysgd: an idle worker is gone (%s); starting new ones", exc)
        stop_crew(crew)
        POOL.release_idle()
        return None
    if nodes is not None:
        order = _seat(infos, nodes)
        if order is None:
            stop_crew(crew)
            POOL.release_idle()
            return None
        crew.actors = [crew.actors[i] for i in order]
        infos = [infos[i] for i in order]
    logger.info("raysgd: reusing %d warm worker(s) (pids %s)", len(infos),
                [info["pid"] for info in infos])
    return crew, infos


def _seat(infos: List[dict], nodes: List[str]) -> Optional[List[int]]:
    """Which idle actor takes each worker's place so it sits on that worker's node."""
    free = list(range(len(infos)))
    order = []
    for node in nodes:
        match = next((i for i in free if infos[i]["node_id"] == node), None)
        if match is None:
            return None
        free.remove(match)
        order.append(match)
    return order


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
