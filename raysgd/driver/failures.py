"""Classify the per-rank failures of one call into the single error to raise.

A dead worker (process or node gone) and the collective errors it causes on
the survivors are one *worker failure*: a :class:`WorkerFailedError` carrying
every rank's cause. Anything else is the user's exception, raised with its own
type, the rank that raised it and the worker's traceback.
"""
from __future__ import annotations

from typing import Sequence

import torch.distributed as dist

from raysgd.errors import RankFailure, WorkerFailedError


# Where gloo's TCP transport raises from: a read or write on a peer's connection failed (the
# peer's process died, or its machine). DDP's reducer raises these inside backward() as a
# plain RuntimeError, not a ``dist.DistError``; a user's mistake never comes from there.
GLOO_TRANSPORT = "gloo/transport/"


def is_collective_error(exc: BaseException) -> bool:
    """True for errors torch.distributed raises when a peer vanishes."""
    return isinstance(exc, dist.DistError) or (
        isinstance(exc, RuntimeError) and GLOO_TRANSPORT in str(exc))


def primary_failure(failures: Sequence[RankFailure]) -> BaseException:
    failures = sorted(failures, key=lambda f: f.rank)
    if any(f.died for f in failures) or all(is_collective_error(f.error) for f in failures):
        return WorkerFailedError("Worker(s) failed; the process group was torn down.", failures)
    first = next(f for f in failures if not is_collective_error(f.error))
    error = first.error
    if first.traceback and first.traceback not in getattr(error, "__notes__", []):
        error.add_note(f"[raysgd] worker traceback (rank {first.rank}):\n{first.traceback}")
    others = [f.describe() for f in failures if f is not first]
    if others:
        error.add_note("[raysgd] other ranks: " + "; ".join(others))
    return error
