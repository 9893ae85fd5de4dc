"""Where a commit's second copy goes, so that losing a worker's node loses no commit.

Chosen once per worker group from the strategy (``commit_copies``). A replicated
strategy's commit is rank 0's full state: it is copied to the driver's node, where the
disk writer and a resume read it anyway. A sharded commit is every rank's own shards: each
is copied to the node of the next rank on another node (the driver's node only when no
rank lives elsewhere), so no node ever stores the whole state for a commit (Ray)
and the copies spread as evenly as the ranks.

A copy is an object of its own, owned by the driver, whose primary copy Ray pins on the target
node (:class:`Copiers`: the return value of a peer rank's ``copy_part``, or the driver's own
``ray.put``): it survives its source's node, and the rank that made it. (Ray's secondary
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
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set

import ray
from ray.exceptions import ObjectLostError, RayError

from raysgd.driver import placement
from raysgd.errors import WorkerFailedError
from raysgd.state.commit import Commit


class Copiers:
    """Who makes a copy on a node: a rank's actor there (on its ``copies`` thread: the copy
    is that call's return value), else the driver itself, on its node, on a thread of its
    own (``ray.put`` of what it read). Either way the driver owns the copy, and no process is
    started for it (Ray 1.12's tests count the actors)."""

    def __init__(self) -> None:
        self._pool: Optional[ThreadPoolExecutor] = None

    def copy(self, ref: Any, actor: Any = None) -> Any:
        """The copy of ``ref``, made by ``actor`` (None: the driver): an ObjectRef pair
        (the copy, its done flag), or the driver's future of the copy."""
        if actor is not None:
            return tuple(actor.copy_part.remote([ref]))
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="raysgd-copies")
        return self._pool.submit(lambda: ray.put(ray.get(ref)))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


@dataclass
class Landing:
    """A commit's copies on their way. ``sources``: the ranks whose part needed one, and the
    node it was made on; ``parts``: those parts; ``copies``: the copies made; ``waiting``:
    per rank still copying, its done flag (a rank's actor copies) or the driver's future;
    ``failed``: ranks whose part could not be copied (its node went, or the driver's own
    copy failed)."""

    sources: Dict[int, str] = field(default_factory=dict)
    parts: Dict[int, Any] = field(default_factory=dict)
    copies: Dict[int, Any] = field(default_factory=dict)
    waiting: Dict[int, Any] = field(default_factory=dict)
    failed: Set[int] = field(default_factory=set)
    copiers: Optional[Copiers] = None

    def start(self, rank: int, actor: Any = None) -> None:
        """Copy ``rank``'s part with ``actor`` (a rank's, on the target node), else the
        driver."""
        made = self.copiers.copy(self.parts[rank], actor)
        if isinstance(made, tuple):
            self.copies[rank], self.waiting[rank] = made
        else:
            self.waiting[rank] = made

    def landed(self, timeout_s: float = 0.0) -> bool:
        """Whether every copy is in place, waiting up to ``timeout_s``. A rank's copy that
        failed (its node went) is made again by the driver while its source lives."""
        flags = {rank: w for rank, w in self.waiting.items() if isinstance(w, ray.ObjectRef)}
        ready = set(ray.wait(list(flags.values()), num_returns=len(flags),
                             timeout=timeout_s)[0]) if flags else set()
        futures = {rank: w for rank, w in self.waiting.items() if isinstance(w, Future)}
        if futures and not flags:
            wait_futures(list(futures.values()), timeout=timeout_s)
        for rank, flag in flags.items():
            if flag in ready:
                del self.waiting[rank]
                try:
                    ray.get(flag)
                except RayError:
                    self._copy_failed(rank, by_driver=False)
        for rank, future in futures.items():
            if future.done():
                del self.waiting[rank]
                try:
                    self.copies[rank] = future.result()
                except Exception:  # noqa: BLE001 - Ray's, the store's: the part is uncopied
                    self._copy_failed(rank, by_driver=True)
        return not self.waiting and not self.failed

    def _copy_failed(self, rank: int, by_driver: bool) -> None:
        self.copies.pop(rank, None)
        if by_driver or rank in self.sources_gone():
            self.failed.add(rank)
        else:  # the copying rank's node went: the driver copies it
            self.start(rank)

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


def _peer(rank: int, nodes: Sequence[str]) -> Optional[int]:
    """The first rank after ``rank`` (cyclically) on another node, or None."""
    count = len(nodes)
    for step in range(1, count):
        other = (rank + step) % count
        if nodes[other] not in (nodes[rank], "local"):
            return other
    return None


def _copied(snapshots: List[Any], sources: Dict[int, str], makers: Dict[int, Any],
            copiers: Copiers) -> Landing:
    landing = Landing(sources, {rank: snapshots[rank] for rank in sources}, copiers=copiers)
    for rank in sources:
        landing.start(rank, makers[rank])
    return landing


def to_driver_node(snapshots: List[Any], nodes: Sequence[str], actors: Sequence[Any],
                   offset: int, copiers: Copiers, slab_ranks: Sequence[int] = ()) -> Landing:
    sources = _sources(snapshots, nodes, slab_ranks)
    return _copied(snapshots, sources, dict.fromkeys(sources), copiers)


def to_peer_nodes(snapshots: List[Any], nodes: Sequence[str], actors: Sequence[Any],
                  offset: int, copiers: Copiers, slab_ranks: Sequence[int] = ()) -> Landing:
    """``offset``: 1 when rank 0 runs in the driver (``actors[rank - offset]``); a part
    with no peer on another node, or whose peer is the driver, is copied by the driver."""
    sources = _sources(snapshots, nodes, slab_ranks)
    peers = {rank: _peer(rank, nodes) for rank in sources}
    makers = {rank: None if peer is None or peer < offset else actors[peer - offset]
              for rank, peer in peers.items()}
    return _copied(snapshots, sources, makers, copiers)


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
