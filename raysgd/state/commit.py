"""The unit of rollback, :class:`Commit`, and how the driver assembles one from the
ranks' parts (:class:`CommitAssembler`); pure data, no Ray.

A worker hands its parts over through :class:`raysgd.worker.handoff.CommitHandoff`;
ranks hand them over one by one, and a commit exists once every rank handed over
the same step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple


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
    # The slab version its snapshots live in (``raysgd.driver.slabs``), and the ranks whose
    # snapshot is there; None and (): all in Ray's store.
    slab_version: Optional[int] = None
    slab_ranks: Tuple[int, ...] = ()


class CommitAssembler:
    """Collects per-rank commit parts until one step is complete on every rank."""

    def __init__(self, world_size: int, committed_step: int):
        self.world_size = world_size
        self.committed_step = committed_step
        self._parts: Dict[int, Dict[int, Tuple[int, Any, int]]] = {}  # step -> rank -> (call_done, ref, epochs)
        self._last_seen: Dict[int, int] = {}

    def after(self, rank: int) -> int:
        """The step a request for ``rank``'s next part should start after."""
        return max(self.committed_step, self._last_seen.get(rank, self.committed_step))

    def add(self, rank: int, step: int, call_done: int, snapshot: Any,
            epochs_done: int = 0) -> Optional[Commit]:
        """Record a part; returns the new :class:`Commit` once ``step`` is complete."""
        self._last_seen[rank] = max(step, self._last_seen.get(rank, step))
        if step <= self.committed_step:
            return None
        parts = self._parts.setdefault(step, {})
        parts[rank] = (call_done, snapshot, epochs_done)
        if len(parts) < self.world_size:
            return None
        self.committed_step = step
        self._parts = {s: p for s, p in self._parts.items() if s > step}
        return Commit(step, parts[0][0], self.world_size,
                      [parts[rank][1] for rank in range(self.world_size)], parts[0][2])
