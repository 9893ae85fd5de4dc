"""The unit of rollback, :class:`Commit`, and how the driver assembles one from the
ranks' parts (:class:`CommitAssembler`); pure data, no Ray.

A worker hands its parts over through :class:`raysgd.worker.handoff.CommitHandoff`;
ranks hand them over one by one, and a commit exists once every rank handed over
the same step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set, Tuple


@dataclass(frozen=True)
class Commit:
    """A consistent point to roll back to: per-rank snapshots taken at ``step``.

    ``snapshots`` are opaque handles (object references) owned by the driver;
    rank 0's holds the full state, the others their own position and RNG.
    """

    step: int
    call_done: int
    world_size: int
    snapshots: List[Any] = field(default_factory=list)
    epochs_done: int = 0  # passes over the train loader finished (the trainer's ``epoch``)
    # The slab versions its snapshots live in (``raysgd.driver.slabs``), and the ranks whose
    # snapshot is there; () and (): all in Ray's store.
    slab_versions: Tuple[int, ...] = ()
    slab_ranks: Tuple[int, ...] = ()


def slab_commit(step: int, call_done: int, world_size: int, snapshots: List[Any],
                epochs_done: int, headers: List[Optional[dict]]) -> Commit:
    """A :class:`Commit` of ``snapshots``, with the slabs its parts went to as each rank's
    header says (``in_slab``, ``slab_version``; a header of None or without them: Ray's
    store)."""
    ranks = tuple(rank for rank, head in enumerate(headers) if head and head.get("in_slab"))
    return Commit(step, call_done, world_size, snapshots, epochs_done,
                  tuple(headers[rank]["slab_version"] for rank in ranks), ranks)


class CommitAssembler:
    """Collects per-rank commit parts until one step is complete on every rank."""

    def __init__(self, world_size: int, committed_step: int):
        self.world_size = world_size
        self.committed_step = committed_step
        # step -> rank -> (call_done, ref, epochs, header)
        self._parts: Dict[int, Dict[int, Tuple[int, Any, int, Optional[dict]]]] = {}
        self._last_seen: Dict[int, int] = {}

    def after(self, rank: int) -> int:
        """The step a request for ``rank``'s next part should start after."""
        return max(self.committed_step, self._last_seen.get(rank, self.committed_step))

    def in_slabs(self) -> List[int]:
        """The slab versions of the parts waiting for the rest of their commit."""
        return [head["slab_version"] for parts in self._parts.values()
                for _, _, _, head in parts.values() if head and head.get("in_slab")]

    def waiting(self) -> Set[int]:
        """The ranks with a part waiting for the rest of its commit."""
        return {rank for parts in self._parts.values() for rank in parts}

    def parts_waiting(self) -> Dict[int, Set[int]]:
        """Step -> the ranks whose part of it waits for the rest."""
        return {step: set(parts) for step, parts in self._parts.items()}

    def add(self, rank: int, step: int, call_done: int, snapshot: Any,
            epochs_done: int = 0, header: Optional[dict] = None) -> Optional[Commit]:
        """Record a part (``header``: where it went, as :func:`slab_commit` reads it);
        returns the new :class:`Commit` once ``step`` is complete."""
        self._last_seen[rank] = max(step, self._last_seen.get(rank, step))
        if step <= self.committed_step:
            return None
        parts = self._parts.setdefault(step, {})
        parts[rank] = (call_done, snapshot, epochs_done, header)
        self._drop_unformable()
        if len(parts) < self.world_size:
            return None
        self.committed_step = step
        self._parts = {s: p for s, p in self._parts.items() if s > step}
        ordered = [parts[rank] for rank in range(self.world_size)]
        return slab_commit(step, ordered[0][0], self.world_size, [p[1] for p in ordered],
                           ordered[0][2], [p[3] for p in ordered])

    def _drop_unformable(self) -> None:
        """Forget the parts whose commit can no longer form: a rank without a part at that
        step was seen past it, and a rank is only asked for steps after the last one it
        handed over (``after``). A rank may skip a step the others commit (it commits again
        after a torn view, its queue overflowed); the parts left waiting would keep their
        slab slots needed, and ``raysgd.driver.watch.waits_for_a_slot`` would then never ask
        their rank again. Kept to the parts that can form, the rank seen least far is never
        kept waiting, so commits keep forming."""
        self._parts = {step: parts for step, parts in self._parts.items()
                       if not any(self._last_seen.get(rank, step) > step
                                  for rank in range(self.world_size) if rank not in parts)}

