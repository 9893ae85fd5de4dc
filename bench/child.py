"""Helpers every variant subprocess uses: arguments, the clock, the result line."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from bench import RESULT_MARKER, T0_ENV
from bench.workloads import MODES, NAMES, Workload


def parse_args(description: str, extra=None) -> argparse.Namespace:
    """``--workload``, ``--mode`` and whatever ``extra(parser)`` adds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", choices=NAMES, default="mlp")
    parser.add_argument("--mode", choices=MODES, default="full")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    if extra:
        extra(parser)
    return parser.parse_args()


def launch_time() -> float:
    """When the parent launched this process (``BENCH_T0``); now, if run by hand."""
    return float(os.environ.get(T0_ENV) or time.time())


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)


class Figures:
    """Collects one run's figures: time to first step and steady throughput."""

    def __init__(self, workload: Workload, t0: Optional[float] = None):
        self.workload = workload
        self.t0 = launch_time() if t0 is None else t0
        self.first_step_s: Optional[float] = None
        self._steady_start: Optional[float] = None
        self._last_epoch: Optional[float] = None
        self.steady_samples_per_s: Optional[float] = None
        self.epoch_s: List[float] = []  # each steady epoch's seconds, where the variant says

    def step_done(self) -> None:
        """Call after every completed step; only the first one is recorded."""
        if self.first_step_s is None:
            self.first_step_s = time.time() - self.t0

    def steady_start(self) -> None:
        """Call when the first epoch has ended."""
        self._steady_start = self._last_epoch = time.perf_counter()

    def epoch_done(self) -> None:
        """Call after each steady epoch (optional): its seconds go to ``epoch_s``."""
        now = time.perf_counter()
        self.epoch_s.append(now - self._last_epoch)
        self._last_epoch = now

    def steady_end(self, epochs: int) -> None:
        """Call after ``epochs`` more full passes over the data set."""
        elapsed = time.perf_counter() - self._steady_start
        self.steady_samples_per_s = epochs * self.workload.num_samples / elapsed

    def as_dict(self) -> Dict[str, Any]:
        return {"first_step_s": self.first_step_s,
                "steady_samples_per_s": self.steady_samples_per_s,
                "train_end_s": time.time() - self.t0, "epoch_s": self.epoch_s}


def emit(figures: Dict[str, Any]) -> None:
    """Print the one result line the parent parses."""
    print(RESULT_MARKER + json.dumps(figures), flush=True)


def leave_process_group() -> None:
    """End a torchrun rank once its figures are out: wait for every rank, then exit without
    gloo's teardown. ``destroy_process_group`` can abort a rank whose peer has already gone
    ("terminate called without an active exception", SIGABRT: seen once in the suite, on
    2026-11-27, which failed a run whose figures were already printed)."""
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
