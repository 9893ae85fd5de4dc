"""Every training step's RNGs seeded from (the run's base, the rank, the step). No Ray.

A rank that dies takes its RNG states along, so a newcomer that takes its place from the
survivors' live state (``raysgd.worker.survivor``) could not draw what the dead rank would
have drawn, and the run would no longer end bitwise equal to an unfaulted one. Seeding each
step from numbers every rank knows makes what a step draws a function of where it is:
the newcomer draws exactly what the dead rank would have. The base is one number per run,
hashed from rank 0's torch RNG after the operators' ``setup`` (so a seed set there decides
it), shared by every rank at set-up and carried in commits and checkpoints. Ranks draw
different streams (the rank is mixed in), as a hand-written loop that seeds ``seed + rank``
does. Seeding costs a few microseconds a step: the generators' own ``manual_seed`` (not
``torch.manual_seed``, which visits every device backend and costs ~0.3 ms).
"""
from __future__ import annotations

import hashlib
import random

import numpy as np
import torch

_MASK = (1 << 64) - 1


def _mix(value: int) -> int:
    """splitmix64's finaliser: neighbouring inputs give unrelated outputs."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def base_from_rng() -> int:
    """A base hashed from this process's torch RNG state (drawing nothing from it)."""
    digest = hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def step_seed(base: int, rank: int, step: int) -> int:
    """The 63-bit seed of ``rank``'s step ``step``."""
    return _mix(_mix(base ^ _mix(rank)) ^ step) >> 1


def seed_step(base: int, rank: int, step: int) -> None:
    """Seed torch's CPU and CUDA generators, NumPy's and Python's for this step."""
    seed = step_seed(base, rank, step)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for generator in torch.cuda.default_generators:
            generator.manual_seed(seed)
    np.random.seed(seed & 0xFFFFFFFF)
    random.seed(seed)
