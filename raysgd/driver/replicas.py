"""Where a commit's second copy goes, so that losing a worker's node loses no commit.

Chosen once per worker group from the strategy (``commit_copies``). A replicated
strategy's commit is rank 0's full state: it is copied to the driver's node, where the
disk writer and a resume read it anyway. A sharded commit is every rank's own shards: each
is copied to the node of the next rank on another node (the driver's node only when no
rank lives elsewhere), so no node ever stores the whole state for a commit (Ray)
and the copies spread as evenly as the ranks.

A copy is an object of its own, returned by the target node's copier (one zero-CPU actor per
node, :class:`Copiers`) and so owned by the driver, whose primary copy Ray pins there: it
survives its source's node, and its copier too. (Ray's secondary
copies do not: they may be evicted, and Ray's recovery of a lost object from one sometimes
gives up at once, ``OBJECT_UNRECONSTRUCTABLE_RETRIES_DISABLED``, with a copy listed alive.)

A copy is started, not awaited: training goes on meanwhile. Each copy function returns a
:class:`Landing`, which says once every copy is in place; until then the commit is pending
(``raysgd.commits.protocol``): a restore still takes it while its nodes live, and a lost node
sends the restore to the newest commit whose copies landed. A call's end waits for its
commit's landing (``Supervisor._hold``), so no call returns a state a lost node can take.
A restore reads a part from its copy once the part's own node is gone (:meth:`readable`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import ray
from ray.exceptions import ObjectLostError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raysgd.driver import placement
from raysgd.errors import WorkerFailedError
from raysgd.state.commit import Commit


@ray.remote(num_cpus=0, max_restarts=0)
class _Copier:
    """Copies commit parts to its node, one at a time (one process per node, not a task's
    process per copy)."""

    @ray.method(num_returns=2)
    def copy(self, parts: list) -> Tuple[Any, bool]:
        """``parts[0]`` stored anew on this node (a list: Ray must not resolve it for the
        caller); the second return is small, so the caller learns the copy is done without
        fetching the copy."""
        return ray.get(parts[0]), True


class Copiers:
    """The supervisor's copiers (its worker groups use them), one per target node, started
    at its first copy; ``close`` stops them (the copies they made stay: the driver owns
    them)."""

    def __init__(self) -> None:
        self._actors: Dict[str, Any] = {}

    def copy(self, ref: Any, node: str) -> Tuple[Any, Any]:
        """(the copy of ``ref`` on ``node``, its done flag)."""
        actor = self._actors.get(node)
        if actor is None:
            target = NodeAffinitySchedulingStrategy(node, soft=False)
            actor = self._actors[node] = _Copier.options(scheduling_strategy=target).remote()
        return tuple(actor.copy.remote([ref]))

    def forget(self, node: str) -> None:
        """``node``'s copier failed a copy (its node went, or it died): the next copy there
        starts a new one."""
        actor = self._actors.pop(node, None)
        if actor is not None:
            ray.kill(actor, no_restart=True)

    def close(self) -> None:
        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        self._actors.clear()


@dataclass
class Landing:
    """A commit's copies on their way. ``sources``: the ranks whose part needed one, and the
    node it was made on; ``parts``: those parts; ``copies``: their copies, and ``targets``
    the nodes they go to; ``waiting``: the done flags of the copies still on their way;
    ``failed``: ranks whose copy failed with their part's node gone (that part is lost)."""

    sources: Dict[int, str] = field(default_factory=dict)
    parts: Dict[int, Any] = field(default_factory=dict)
    copies: Dict[int, Any] = field(default_factory=dict)
    targets: Dict[int, str] = field(default_factory=dict)
    waiting: Dict[int, Any] = field(default_factory=dict)
    failed: Set[int] = field(default_factory=set)
    copiers: Optional[Copiers] = None

    def start(self, rank: int, node: Optional[str]) -> None:
        self.targets[rank] = node or driver_node()
        self.copies[rank], self.waiting[rank] = self.copiers.copy(self.parts[rank],
                                                                  self.targets[rank])

    def landed(self, timeout_s: float = 0.0) -> bool:
        """Whether every copy is in place, waiting up to ``timeout_s``. A copy that failed
        (its target node went) is made again on the driver's node while its source lives."""
        if self.waiting:
            flags = list(self.waiting.values())
            ready, _ = ray.wait(flags, num_returns=len(flags), timeout=timeout_s)
            for rank in [rank for rank, flag in self.waiting.items() if flag in ready]:
                try:
                    ray.get(self.waiting.pop(rank))
                except RayError:
                    self.copiers.forget(self.targets[rank])
                    if rank in self.sources_gone():
                        self.failed.add(rank)
                    else:  # its target went: the driver's node, with a new copier
                        self.start(rank, None)
        return not self.waiting and not self.failed

    def sources_gone(self) -> Set[int]:
        """The ranks whose part's node died."""
        gone = placement.gone_nodes(set(self.sources.values()))
        return {rank for rank, node in self.sources.items() if node in gone}

    def readable(self, commit: Commit) -> Commit:
        """``commit`` with each part whose node died read from its copy instead (one that
        landed: a restore takes a commit whose lost part has none only while it lives)."""
        gone = self.sources_gone() & (set(self.copies) - set(self.waiting) - self.failed)
        if not gone:
            return commit
        snapshots = [self.copies[rank] if rank in gone else ref
                     for rank, ref in enumerate(commit.snapshots)]
        return dataclasses.replace(commit, snapshots=snapshots)


NO_COPIES = Landing()  # nothing to copy: a commit held where no failure of a rank reaches


def driver_node() -> Optional[str]:
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _sources(snapshots: List[Any], nodes: Sequence[str], slab_ranks: Sequence[int]
             ) -> Dict[int, str]:
    """The ranks whose part lives off the driver's node, in Ray's store (a slab is the
    driver's, and a small part lives in the driver's memory)."""
    here = driver_node()
    return {rank: nodes[rank] for rank, ref in enumerate(snapshots)
            if isinstance(ref, ray.ObjectRef) and rank < len(nodes) and rank not in slab_ranks
            and nodes[rank] not in (here, "local")}


def _peer_node(rank: int, nodes: Sequence[str]) -> Optional[str]:
    """The node of the first rank after ``rank`` (cyclically) on another node, or None."""
    count = len(nodes)
    for step in range(1, count):
        other = nodes[(rank + step) % count]
        if other not in (nodes[rank], "local"):
            return other
    return None


def _copied(snapshots: List[Any], sources: Dict[int, str],
            targets: Dict[int, Optional[str]], copiers: Copiers) -> Landing:
    landing = Landing(sources, {rank: snapshots[rank] for rank in sources}, copiers=copiers)
    for rank in sources:
        landing.start(rank, targets[rank])
    return landing


def to_driver_node(snapshots: List[Any], nodes: Sequence[str], copiers: Copiers,
                   slab_ranks: Sequence[int] = ()) -> Landing:
    sources = _sources(snapshots, nodes, slab_ranks)
    return _copied(snapshots, sources, dict.fromkeys(sources), copiers)


def to_peer_nodes(snapshots: List[Any], nodes: Sequence[str], copiers: Copiers,
                  slab_ranks: Sequence[int] = ()) -> Landing:
    sources = _sources(snapshots, nodes, slab_ranks)
    return _copied(snapshots, sources, {rank: _peer_node(rank, nodes) for rank in sources},
                   copiers)


def rehomed(snapshots: List[Any]) -> List[Any]:
    """``snapshots``, each one Ray also keeps a copy of on a node that is gone (lost, its
    death not yet known to Ray) stored anew from the driver node's copy. A rank reading it
    would otherwise try the dead copy first and wait out Ray's pull timeout (10 s)."""
    refs = [ref for ref in snapshots if isinstance(ref, ray.ObjectRef)]
    if not refs or not ray.is_initialized() or placement.driver_is_ray_client():
        return snapshots
    here = driver_node()
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
    commit part whose node went before the driver learnt of it."""
    causes = [f.error for f in exc.failures] if isinstance(exc, WorkerFailedError) else [exc]
    return any(isinstance(cause, ObjectLostError) for cause in causes)


def commit_copies(strategy: Any):
    """The copy function for ``WorkerSettings.strategy``."""
    return to_peer_nodes if strategy.commit_copies == "peers" else to_driver_node
