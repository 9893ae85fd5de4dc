"""How the chaos runs see their ranks: the recovery benchmark's step log, per process.

Worker side (:class:`ChaosLog`): a rank's first step in a process starts a
:class:`bench.recovery.steplog.StepLog` for it, which writes the rank's pid and node files
(and, for rank 0, appends ``step wall pid`` after every step). So the injector always finds
the process that holds a rank *now*: a spare or a restarted worker takes over a rank
without running set-up again.

Only the standard library here: Ray workers and torchrun's workers import this module.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from bench.recovery.steplog import StepLog, read_node, read_pid


class ChaosLog:
    """``log = ChaosLog(step_dir, node)``; ``log.completed(rank, step)`` after every step."""

    def __init__(self, directory: str, node: str):
        self.directory, self.node = directory, node
        self._logs: Dict[int, StepLog] = {}

    def completed(self, rank: int, step: int) -> None:
        if rank not in self._logs:
            self._logs[rank] = StepLog(self.directory, rank, self.node)
        self._logs[rank].completed(step)


def read_rank(directory: str, rank: int) -> Optional[Tuple[int, str]]:
    """``(pid, node)`` of the process that last trained as ``rank``; None before its first
    step."""
    try:
        return read_pid(directory, rank), read_node(directory, rank)
    except (FileNotFoundError, ValueError):
        return None
