"""Where a commit's second copy goes, so that losing a worker's node loses no commit.

Chosen once per worker group from the strategy (``commit_copies``). A replicated
strategy's commit is rank 0's full state: it is copied to the driver's node, where the
disk writer and a resume read it anyway. A sharded commit is every rank's own shards: each
is copied to the node of the next rank on another node (the driver's node only when no
rank lives elsewhere), so no node ever stores the whole state for a commit (Ray)
and the copies spread as evenly as the ranks.

A copy is started, not awaited: training goes on meanwhile. Until it has landed, losing
the node the commit was made on loses the commit, so a group whose copies cross nodes
(``crosses_nodes``) has its supervisor keep the commit before as a fallback.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import ray
from ray.exceptions import ObjectLostError

from raysgd.driver import placement
from raysgd.driver.watch import pull_to_driver
from raysgd.errors import WorkerFailedError


def _peer(rank: int, nodes: Sequence[str]) -> Optional[int]:
    """The first rank after ``rank`` (cyclically) on another node, or None."""
    count = len(nodes)
    for step in range(1, count):
        other = (rank + step) % count
        if nodes[other] != nodes[rank]:
            return other
    return None


def to_driver_node(snapshots: List[Any], nodes: Sequence[str], actors: Sequence[Any],
                   offset: int) -> None:
    pull_to_driver(snapshots)


def to_peer_nodes(snapshots: List[Any], nodes: Sequence[str], actors: Sequence[Any],
                  offset: int) -> None:
    """``offset``: 1 when rank 0 runs in the driver (``actors[rank - offset]``)."""
    driver_node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    for rank, ref in enumerate(snapshots):
        if not isinstance(ref, ray.ObjectRef) or rank >= len(nodes):
            continue
        peer = _peer(rank, nodes)
        if peer is None or peer < offset:  # no other node, or the peer is the driver itself
            if nodes[rank] != driver_node and nodes[rank] != "local":
                pull_to_driver([ref])
            continue
        actors[peer - offset].copy_here.remote([ref])  # a list: Ray must not resolve it


def rehomed(snapshots: List[Any]) -> List[Any]:
    """``snapshots``, each one Ray also keeps a copy of on a node that is gone (lost, its
    death not yet known to Ray) stored anew from the driver node's copy. A rank reading it
    would otherwise try the dead copy first and wait out Ray's pull timeout (10 s)."""
    refs = [ref for ref in snapshots if isinstance(ref, ray.ObjectRef)]
    if not refs or not ray.is_initialized() or placement.driver_is_ray_client():
        return snapshots
    here = ray.get_runtime_context().get_node_id()
    where = {ref: set(found.get("node_ids") or ()) for ref, found in
             ray.experimental.get_object_locations(refs, timeout_ms=2000).items()}
    held = set().union(*where.values()) - {here}
    gone = held and (held - placement.alive_nodes()) | placement.unreachable_nodes(held)
    if not gone:
        return snapshots
    return [ray.put(ray.get(ref)) if isinstance(ref, ray.ObjectRef)
            and where.get(ref, set()) & gone and here in where[ref] else ref
            for ref in snapshots]


def crosses_nodes(nodes: Sequence[str]) -> bool:
    """Whether a commit of ranks on ``nodes`` is copied from one node to another: only when
    some rank runs off the driver's node (otherwise every copy is a no-op)."""
    driver_node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    return any(node not in ("local", driver_node) for node in nodes)


def lost_objects(exc: BaseException) -> bool:
    """True when ``exc`` (or a rank's cause in it) is an object Ray lost with its node: a
    commit part whose copy had not landed yet."""
    causes = [f.error for f in exc.failures] if isinstance(exc, WorkerFailedError) else [exc]
    return any(isinstance(cause, ObjectLostError) for cause in causes)


def commit_copies(strategy: Any):
    """The copy function for ``WorkerSettings.strategy``."""
    return to_peer_nodes if strategy.commit_copies == "peers" else to_driver_node
