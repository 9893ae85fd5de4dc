"""Fetching the files each rank staged for a sharded disk checkpoint (``StagedShards``).

Every rank wrote its part on its own node (``raysgd.worker.staging``); the disk writer's
thread asks for them one rank at a time, so the driver holds one rank's files at once.
The calls run in the workers' ``copies`` thread, beside training.
"""
from __future__ import annotations

from typing import Any, Iterator

import ray

from raysgd.errors import CheckpointError
from raysgd.state.dirblob import DirBlob

FETCH_TIMEOUT_S = 300.0


def staged_parts(group: Any, step: int) -> Iterator[DirBlob]:
    """Every rank's staged files of ``step``, in rank order."""
    if group is None:
        raise CheckpointError(f"the workers are being replaced; the checkpoint of step {step} "
                              "is skipped and the next one is written")
    if group.local_runner is not None:
        yield group.local_runner.staged_files(step)
    for actor in list(group.actors):
        yield ray.get(actor.staged_files.remote(step), timeout=FETCH_TIMEOUT_S)
