"""Cluster resources for the worker group: start Ray, check, reserve, count.

Part of the worker group's Ray boundary (with ``worker_group.py``).
"""
from __future__ import annotations

import logging
import math
import socket
import time
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Set, Tuple

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from raysgd.errors import ResourcesUnavailableError

logger = logging.getLogger("raysgd")


def ensure_ray() -> None:
    """Start an embedded local Ray unless the user already called ``ray.init``."""
    if not ray.is_initialized():
        logger.info("raysgd: ray.init() with defaults (call ray.init(address='auto') "
                    "first to join a cluster)")
        ray.init()


def driver_is_ray_client() -> bool:
    """Whether this process drives Ray through Ray Client (``ray.init("ray://...")``)."""
    import ray.util.client

    return ray.util.client.ray.is_connected()


def ray_session() -> tuple:
    """Names the Ray session this driver is in: actors of another session are gone."""
    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_job_id()


def inside_placement_group() -> bool:
    """Whether this process runs inside a placement group someone else reserved (a Tune
    trial's actor, for one); False before Ray starts."""
    return ray.is_initialized() and ray.util.get_current_placement_group() is not None


def alive_nodes() -> set:
    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def gone_nodes(nodes: Collection[str]) -> Set[str]:
    """Those of ``nodes`` that died, or whose raylet no longer answers (died moments ago)."""
    nodes = set(nodes)
    return (nodes - alive_nodes()) | unreachable_nodes(nodes) if nodes else set()


def unreachable_nodes(nodes: Collection[str], timeout_s: float = 0.5) -> Set[str]:
    """Those of ``nodes`` whose raylet takes no connection: nodes that died moments ago
    (Ray lists them alive until its health checks fail). None under Ray Client, whose
    driver may reach no raylet at all."""
    if driver_is_ray_client():
        return set()
    found = set()
    for node, address in _raylet_addresses(nodes).items():
        try:
            socket.create_connection(address, timeout=timeout_s).close()
        except OSError:
            found.add(node)
    return found


# A node id's raylet address never changes: asked of the GCS once per node, since a watch
# may check a late rank's node every half second.
_RAYLETS: Dict[str, Tuple[str, int]] = {}


def _raylet_addresses(nodes: Collection[str]) -> Dict[str, Tuple[str, int]]:
    if any(node not in _RAYLETS for node in nodes):
        for entry in ray.nodes():
            if entry.get("Alive"):
                _RAYLETS[entry["NodeID"]] = (entry["NodeManagerAddress"],
                                             entry["NodeManagerPort"])
    return {node: _RAYLETS[node] for node in nodes if node in _RAYLETS}


def driver_node() -> Optional[str]:
    """The node id (hex) of this driver process, or None without Ray or under Ray Client."""
    if not ray.is_initialized() or driver_is_ray_client():
        return None
    return ray.get_runtime_context().get_node_id()


def draining_nodes() -> Dict[str, int]:
    """Nodes Ray is draining (``ray drain-node``, as KubeRay and the autoscaler call it for a
    preemption): ``{node id hex: deadline in epoch ms}``, 0 for no deadline. Under Ray
    Client the driver cannot ask the GCS; it then sees none."""
    if not ray.is_initialized() or driver_is_ray_client():
        return {}
    from ray._private.state import state

    try:
        return dict(state.get_draining_nodes())
    except Exception as exc:  # noqa: BLE001 - a watch that fails must not stop training
        logger.debug("raysgd: could not read the draining nodes: %r", exc)
        return {}


def node_cpus() -> Dict[str, float]:
    """Every live node's logical CPUs, as its raylet declared them."""
    return {n["NodeID"]: n.get("Resources", {}).get("CPU", 0.0)
            for n in ray.nodes() if n.get("Alive")}


def bundle_nodes(group: PlacementGroup) -> Dict[int, str]:
    """The node each bundle of a ready placement group sits on."""
    return ray.util.placement_group_table(group)["bundles_to_node_id"]


def cluster_gpus() -> float:
    ensure_ray()
    return ray.cluster_resources().get("GPU", 0.0)


def _shown(resources: Dict[str, float]) -> Dict[str, float]:
    return {k: v for k, v in resources.items() if k in ("CPU", "GPU")}


def _fits(node: Dict[str, float], bundle: Dict[str, float], count: int = 1) -> bool:
    return all(node.get(k, 0) >= v * count for k, v in bundle.items())


def check_can_ever_place(bundle: Dict[str, float], count: int, strategy: str = "PACK") -> None:
    """Fail at once when the cluster could never hold ``count`` bundles placed by ``strategy``."""
    total = ray.cluster_resources()
    for key, amount in bundle.items():
        if amount * count > total.get(key, 0):
            raise ResourcesUnavailableError(
                f"Requested {count} worker(s) with {bundle} each ({key}: {amount * count:g} in all), "
                f"but the whole cluster has {key}: {total.get(key, 0):g}. Lower num_workers or "
                "num_cpus_per_worker, set use_gpu=False, or add nodes.")
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        return
    if not any(_fits(n, bundle) for n in nodes):
        raise ResourcesUnavailableError(
            f"No node can hold one worker of {bundle}; the largest nodes have "
            f"{[_shown(n) for n in nodes]}. Lower num_cpus_per_worker.")
    if strategy == "STRICT_PACK" and not any(_fits(n, bundle, count) for n in nodes):
        raise ResourcesUnavailableError(
            f"placement_strategy='STRICT_PACK' needs one node for all {count} worker(s) of "
            f"{bundle}; the nodes have {[_shown(n) for n in nodes]}. Use 'PACK' or fewer workers.")
    holding_one = sum(_fits(n, bundle) for n in nodes)
    if strategy == "STRICT_SPREAD" and holding_one < count:
        raise ResourcesUnavailableError(
            f"placement_strategy='STRICT_SPREAD' needs {count} nodes that each hold a worker of "
            f"{bundle}; only {holding_one} do. Use 'SPREAD' or add nodes.")


@dataclass(frozen=True)
class Reservation:
    """Bundles reserved by someone else for our workers, e.g. a Ray Tune trial's group.

    Workers go into bundles ``first_bundle .. first_bundle + size - 1``; the
    group outlives the workers and is never removed by raysgd.
    """

    group: PlacementGroup
    first_bundle: int
    size: int


def host_bundles(worker: Dict[str, float], count: int,
                 per_host: Optional[int] = None) -> List[Dict[str, float]]:
    """Bundles for ``count`` workers: one each, or one per host holding ``per_host`` of them."""
    per = per_host or 1
    return [{key: amount * per for key, amount in worker.items()}
            for _ in range(-(-count // per))]


def reserve(bundle: Dict[str, float], count: int, timeout_s: float,
            strategy: str = "PACK") -> PlacementGroup:
    """A ready placement group of ``count`` bundles, or ResourcesUnavailableError
    (also a ``TimeoutError``, as legacy raised) after ``timeout_s``."""
    group = placement_group([bundle] * count, strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise ResourcesUnavailableError(
            f"Could not place {count} worker(s) of {bundle} ({strategy}) within {timeout_s:.0f}s; available "
            f"now: {_shown(ray.available_resources())}, cluster total: "
            f"{_shown(ray.cluster_resources())}. Free resources, lower num_workers/"
            "num_cpus_per_worker, or raise placement_timeout_s. Idle warm workers of another "
            "driver or Tune trial may hold GPUs: raysgd.release_idle_workers() there.")
    return group


def release(group: PlacementGroup, expect_available: Optional[Dict[str, float]] = None,
            wait_s: float = 5.0) -> None:
    """Remove ``group``. Given ``expect_available`` (what the cluster will show free once the
    group's resources are back), wait up to ``wait_s`` for it, so a trainer built right after
    a shutdown finds them, as legacy RaySGD's shutdown did."""
    remove_placement_group(group)
    deadline = time.monotonic() + wait_s
    while expect_available and time.monotonic() < deadline:
        have = ray.available_resources()
        if all(have.get(key, 0.0) >= amount - 1e-9 for key, amount in expect_available.items()):
            return
        time.sleep(0.05)


def placeable_workers(bundle: Dict[str, float], settle_s: float = 2.0, want: int = 0) -> int:
    """How many more workers of ``bundle`` fit now.

    Resources of killed actors come back asynchronously, so wait up to
    ``settle_s`` for the count to reach ``want``.
    """
    deadline = time.monotonic() + settle_s
    while True:
        available = ray.available_resources()
        count = min(math.floor(available.get(k, 0) / v + 1e-9) for k, v in bundle.items())
        if count >= want or time.monotonic() >= deadline:
            return count
        time.sleep(0.1)
