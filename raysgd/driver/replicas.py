"""Where a commit's second copy goes, so that losing a worker's node loses no commit.

Chosen once per worker group from the strategy (``commit_copies``). A replicated
strategy's commit is rank 0's full state: it is copied to the driver's node, where the
disk writer and a resume read it anyway. A sharded commit is every rank's own shards: each
is copied to the node of the next rank on another node (the driver's node only when no
rank lives elsewhere), so no node ever stores the whole state for a commit (Ray)
and the copies spread as evenly as the ranks.

A copy is started, not awaited: training goes on meanwhile. Each copy function returns a
:class:`Landing`, which says once every copy is in place; until then the commit is pending
(``raysgd.commits.protocol``): a restore still takes it while its nodes live, and a lost node
sends the restore to the newest commit whose copies landed. A call's end waits for its
commit's landing (``Supervisor._hold``), so no call returns a state a lost node can take.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set

import ray
from ray.exceptions import ObjectLostError, RayError

from raysgd.driver import placement
from raysgd.driver.watch import pull_to_driver
from raysgd.errors import WorkerFailedError


@dataclass
class Landing:
    """A commit's copies on their way. ``sources``: the ranks whose part needed one, and the
    node it was made on; ``fetched``: refs copied to the driver's node; ``calls``: a peer's
    ``copy_here`` call per ref it copies (True once the copy is local there)."""

    sources: Dict[int, str] = field(default_factory=dict)
    fetched: List[Any] = field(default_factory=list)
    calls: Dict[Any, Any] = field(default_factory=dict)  # call ref -> the ref it copies

    def landed(self, timeout_s: float = 0.0) -> bool:
        """Whether every copy is in place, waiting up to ``timeout_s``. A peer's copy that
        failed (its process died, its wait ran out) is made to the driver's node instead."""
        if self.calls:
            ready, _ = ray.wait(list(self.calls), num_returns=len(self.calls), timeout=timeout_s)
            for call in ready:
                ref = self.calls.pop(call)
                try:
                    done = ray.get(call)
                except RayError:
                    done = False
                if not done:
                    pull_to_driver([ref])
                    self.fetched.append(ref)
        if self.fetched:
            ready, _ = ray.wait(self.fetched, num_returns=len(self.fetched), timeout=timeout_s,
                                fetch_local=True)
            here = set(held_here(ready))
            self.fetched = [ref for ref in self.fetched if ref not in here]
        return not self.calls and not self.fetched

    def sources_gone(self) -> Set[int]:
        """The ranks whose part's node died before its copy landed: that part is lost."""
        gone = placement.gone_nodes(set(self.sources.values()))
        return {rank for rank, node in self.sources.items() if node in gone}


def held_here(refs: List[Any]) -> List[Any]:
    """Those of ``refs`` this node's store holds. ``ray.wait`` also counts an object lost with
    its node as ready (reading it raises), so ready alone is not landed."""
    if not refs or placement.driver_is_ray_client():
        return list(refs)  # no locations to be had: trust the wait
    here = ray.get_runtime_context().get_node_id()
    where = ray.experimental.get_object_locations(refs, timeout_ms=2000)
    return [ref for ref in refs if here in (where.get(ref, {}).get("node_ids") or ())]


NO_COPIES = Landing()  # nothing to copy: a commit held where no failure of a rank reaches


def _sources(snapshots: List[Any], nodes: Sequence[str], slab_ranks: Sequence[int]
             ) -> Dict[int, str]:
    """The ranks whose part lives off the driver's node, in Ray's store (a slab is the
    driver's, and a small part lives in the driver's memory)."""
    driver_node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    return {rank: nodes[rank] for rank, ref in enumerate(snapshots)
            if isinstance(ref, ray.ObjectRef) and rank < len(nodes) and rank not in slab_ranks
            and nodes[rank] not in (driver_node, "local")}


def _peer(rank: int, nodes: Sequence[str]) -> Optional[int]:
    """The first rank after ``rank`` (cyclically) on another node, or None."""
    count = len(nodes)
    for step in range(1, count):
        other = (rank + step) % count
        if nodes[other] != nodes[rank]:
            return other
    return None


def to_driver_node(snapshots: List[Any], nodes: Sequence[str], actors: Sequence[Any],
                   offset: int, slab_ranks: Sequence[int] = ()) -> Landing:
    sources = _sources(snapshots, nodes, slab_ranks)
    refs = [snapshots[rank] for rank in sources]
    pull_to_driver(refs)
    return Landing(sources, refs)


def to_peer_nodes(snapshots: List[Any], nodes: Sequence[str], actors: Sequence[Any],
                  offset: int, slab_ranks: Sequence[int] = ()) -> Landing:
    """``offset``: 1 when rank 0 runs in the driver (``actors[rank - offset]``)."""
    landing = Landing(_sources(snapshots, nodes, slab_ranks))
    for rank in landing.sources:
        ref, peer = snapshots[rank], _peer(rank, nodes)
        if peer is None or peer < offset:  # no other node, or the peer is the driver itself
            pull_to_driver([ref])
            landing.fetched.append(ref)
        else:  # a list: Ray must not resolve it
            landing.calls[actors[peer - offset].copy_here.remote([ref])] = ref
    return landing


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


def lost_objects(exc: BaseException) -> bool:
    """True when ``exc`` (or a rank's cause in it) is an object Ray lost with its node: a
    commit part whose copy had not landed yet."""
    causes = [f.error for f in exc.failures] if isinstance(exc, WorkerFailedError) else [exc]
    return any(isinstance(cause, ObjectLostError) for cause in causes)


def commit_copies(strategy: Any):
    """The copy function for ``WorkerSettings.strategy``."""
    return to_peer_nodes if strategy.commit_copies == "peers" else to_driver_node
