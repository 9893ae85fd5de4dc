"""What a worker process looked like before any trainer used it; no Ray here.

A pooled worker serves one trainer after another (``raysgd.pool``). User code
must not be able to tell it from a fresh process, so between trainers the
state a trainer may have changed goes back to how the process started:
environment variables (an ``initialization_hook`` often sets some), the
working directory, every RNG, and raysgd's own module-level state. Modules the
user imported stay imported: that is the point of keeping the process.
"""
from __future__ import annotations

import gc
import os
import random
from dataclasses import dataclass
from typing import Dict

import numpy as np
import torch

from raysgd import func_session, precision


@dataclass(frozen=True)
class Baseline:
    environ: Dict[str, str]
    cwd: str

    @classmethod
    def capture(cls) -> "Baseline":
        return cls(dict(os.environ), os.getcwd())

    def restore(self) -> None:
        """Put the process back as captured and free what the last trainer left."""
        _restore_environ(self.environ)
        try:
            os.chdir(self.cwd)
        except OSError:
            pass  # the directory is gone; the next trainer's hook can still chdir
        # A new process seeds torch (CUDA included), Python and numpy from OS entropy.
        torch.seed()
        random.seed()
        np.random.seed()
        _reset_raysgd_modules()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            # GPU memory must be back before the next trainer allocates; a full collection
            # (0.2-0.5 s with torch loaded) frees what reference cycles hold. CPU memory is
            # freed by reference counting and the collector's own schedule.
            gc.collect()
            torch.cuda.empty_cache()


def _restore_environ(saved: Dict[str, str]) -> None:
    for key in [key for key in os.environ if key not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _reset_raysgd_modules() -> None:
    func_session.reset()
    precision.reset_warnings()
