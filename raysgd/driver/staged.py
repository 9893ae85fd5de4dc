"""Where the disk writer takes a checkpoint's content from (:func:`disk_source`), and the
files each rank staged for a sharded disk checkpoint (:func:`staged_parts`).

Every rank wrote its part on its own node (``raysgd.worker.staging``); the disk writer's
thread asks for them one rank at a time, so the driver holds one rank's files at once.
The calls run in the workers' ``copies`` thread, beside training.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import ray

from raysgd.driver.watch import fetch_to_driver
from raysgd.errors import CheckpointError
from raysgd.state.dirblob import DirBlob
from raysgd.state.disk_checkpoints import CommitFiles, StagedShards
from raysgd.state.disk_schedule import DiskSchedule

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


def disk_source(staged: Optional[DiskSchedule], current_group: Callable[[], Any]):
    """The ranks' staged shards where they write them (a sharding strategy's
    ``WorkerSettings.staged_disk``), else the commit's snapshots, fetched to the driver."""
    if staged is not None:
        return StagedShards(lambda step: staged_parts(current_group(), step),
                            stage_now=lambda: current_group().execute("stage_now"))
    return CommitFiles(fetch_to_driver)
