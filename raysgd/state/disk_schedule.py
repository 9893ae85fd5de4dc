"""Which commits go to ``checkpoint_dir``: one rule for the driver's writer and the ranks.

Under a replicated strategy the driver alone applies it (it writes rank 0's commit);
under a sharding strategy every rank applies it too, to stage its shards at exactly
the commits the driver will ask for. One object, so the two can never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class DiskSchedule:
    """Every call-end commit, and the in-epoch commits on multiples of ``every_n_steps``
    (``checkpoint_every_n_steps_to_disk``; None: call ends only).

    In-epoch commits are taken on multiples of ``checkpoint_every_n_steps`` of the global
    step, which the driver checks divides ``every_n_steps``, so every multiple is a commit.
    """

    every_n_steps: Optional[int] = None

    def due(self, step: int, call_end: bool) -> bool:
        """Whether the commit at global ``step`` goes to disk."""
        return call_end or bool(self.every_n_steps) and step % self.every_n_steps == 0
