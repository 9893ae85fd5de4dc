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


# A peer's connection lost under gloo's TCP transport (its process died, or its machine):
# DDP's reducer raises it inside backward() as a plain RuntimeError, not a
# ``dist.DistError``. Only these causes: the same file also checks sizes, which a user's
# mismatched collective fails.
GLOO_TRANSPORT = "gloo/transport/"
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def is_collective_error(exc: BaseException) -> bool:
    """True for errors torch.distributed raises when a peer vanishes."""
    if isinstance(exc, dist.DistError):
        return True
    message = str(exc) if isinstance(exc, RuntimeError) else ""
    return GLOO_TRANSPORT in message and any(cause in message for cause in PEER_GONE)


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
