"""What a worker process looked like before any trainer used it; no Ray here.

A pooled worker serves one trainer after another (``raysgd.driver.pool``). Between
trainers the process state a trainer commonly changes goes back to how the
process started: environment variables (an ``initialization_hook`` often sets
some), the working directory, ``sys.path``, torch's global switches (default
dtype, deterministic algorithms, cuDNN flags, float32 matmul precision, grad
mode, intra-op threads: the next trainer may give its workers fewer CPUs), every
RNG (reseeded from entropy, as a new process is), and raysgd's own module-level
state. Modules the user imported stay imported (that is the point
of keeping the process), and with them whatever state they keep themselves.
"""
from __future__ import annotations

import gc
import os
import random
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List

import numpy as np
import torch

from raysgd.worker import malloc_arena

# Modules that keep module-level state register how to forget it (``on_restore``);
# this module imports none of them, so the worker's base never depends on the
# integrations (a function trainable's session) that keep such state.
_RESETS: List[Callable[[], None]] = []


def on_restore(reset: Callable[[], None]) -> Callable[[], None]:
    """Call ``reset`` at every :meth:`Baseline.restore`; a decorator."""
    _RESETS.append(reset)
    return reset


@dataclass(frozen=True)
class Baseline:
    environ: Dict[str, str]
    cwd: str
    path: List[str]
    torch_switches: Dict[str, Any]

    @classmethod
    def capture(cls) -> "Baseline":
        return cls(dict(os.environ), os.getcwd(), list(sys.path), _torch_switches())

    def restore(self) -> None:
        """Put the process back as captured and free what the last trainer left."""
        _restore_environ(self.environ)
        try:
            os.chdir(self.cwd)
        except OSError:
            pass  # the directory is gone; the next trainer's hook can still chdir
        sys.path[:] = self.path
        _set_torch_switches(self.torch_switches)
        # A new process seeds torch (CUDA included), Python and numpy from OS entropy.
        torch.seed()
        random.seed()
        np.random.seed()
        _reset_raysgd_modules()
        # The last trainer's state must be gone before the next one allocates its own; what
        # reference cycles hold (modules and their hooks: under FSDP a whole shard) would
        # otherwise wait for the collector's own schedule, a state more per recovery. (A
        # worker froze what it held at capture, so this walks only what trainers made.)
        gc.collect()
        # is_initialized first: is_available() would start CUDA's driver in a process that
        # has not yet chosen its device (a GPU spare, _WorkerActor.use_devices).
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        malloc_arena.trim()  # and what it freed, back to the system


def _restore_environ(saved: Dict[str, str]) -> None:
    for key in [key for key in os.environ if key not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _torch_switches() -> Dict[str, Any]:
    return {"default_dtype": torch.get_default_dtype(),
            "deterministic": torch.are_deterministic_algorithms_enabled(),
            "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "matmul_precision": torch.get_float32_matmul_precision(),
            "grad_enabled": torch.is_grad_enabled(),
            "num_threads": torch.get_num_threads()}


def _set_torch_switches(switches: Dict[str, Any]) -> None:
    torch.set_default_dtype(switches["default_dtype"])
    torch.use_deterministic_algorithms(switches["deterministic"],
                                       warn_only=switches["deterministic_warn_only"])
    torch.backends.cudnn.benchmark = switches["cudnn_benchmark"]
    torch.backends.cudnn.deterministic = switches["cudnn_deterministic"]
    torch.set_float32_matmul_precision(switches["matmul_precision"])
    torch.set_grad_enabled(switches["grad_enabled"])
    if torch.get_num_threads() != switches["num_threads"]:
        torch.set_num_threads(switches["num_threads"])


def _reset_raysgd_modules() -> None:
    for reset in list(_RESETS):
        reset()
