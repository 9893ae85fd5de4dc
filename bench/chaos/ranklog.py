"""How the chaos runs see their ranks: the step log plus, per rank, its process and node.

Worker side (:class:`ChaosLog`): rank 0 appends ``step wall pid`` to the recovery
benchmark's step log after every completed step (:mod:`bench.recovery.steplog`, read with
its ``read_log``); every rank writes ``rank{r}`` = ``pid node`` at its first step in a
process, so the injector always finds the process that holds a rank *now* (a spare or a
restarted worker takes over a rank without running set-up again).

Only the standard library here: Ray workers and torchrun's workers import this module.
"""
from __future__ import annotations

import os
import time
from typing import Dict, Optional, Tuple

from bench.recovery.steplog import LOG_NAME


def _rank_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}")


class ChaosLog:
    """``log = ChaosLog(step_dir, node)``; ``log.completed(rank, step)`` after every step."""

    def __init__(self, directory: str, node: str):
        self.directory, self.node = directory, node
        self._pid = os.getpid()
        self._ranks_written = set()
        self._handle = None

    def completed(self, rank: int, step: int) -> None:
        if rank not in self._ranks_written:
            path = _rank_path(self.directory, rank)
            with open(path + f".{self._pid}", "w") as handle:
                handle.write(f"{self._pid} {self.node}")
            os.replace(path + f".{self._pid}", path)
            self._ranks_written.add(rank)
        if rank == 0:
            if self._handle is None:
                self._handle = open(os.path.join(self.directory, LOG_NAME), "a")
            self._handle.write(f"{step} {time.time():.6f} {self._pid}\n")
            self._handle.flush()


def read_rank(directory: str, rank: int) -> Optional[Tuple[int, str]]:
    """``(pid, node)`` of the process that last trained as ``rank``; None before its first
    step."""
    try:
        with open(_rank_path(directory, rank)) as handle:
            pid, node = handle.read().split()
    except (FileNotFoundError, ValueError):
        return None
    return int(pid), node


def read_ranks(directory: str, num_ranks: int) -> Dict[int, Tuple[int, str]]:
    return {rank: found for rank in range(num_ranks)
            if (found := read_rank(directory, rank)) is not None}
