"""Where the disk writer takes a checkpoint's content from (:func:`disk_source`), and the
files each rank staged for a sharded disk checkpoint (:func:`staged_parts`).

Every rank wrote its part on its own node (``raysgd.worker.staging``); the disk writer's
thread asks for them one rank at a time, so the driver holds one rank's files at once. A
rank on the driver's node sends the files' paths instead (``FileRef``): the store links
them into a local ``checkpoint_dir`` or uploads them from there, with no copy through Ray.
The calls run in the workers' ``copies`` thread, beside training.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import ray

from raysgd.driver import placement
from raysgd.driver.watch import fetch_to_driver
from raysgd.errors import CheckpointError, first_line
from raysgd.state.dirblob import DirBlob, unpin
from raysgd.state.commit_files import CommitFiles
from raysgd.state.disk_checkpoints import StagedShards
from raysgd.state.disk_schedule import DiskSchedule

FETCH_TIMEOUT_S = 300.0


def staged_parts(group: Any, step: int) -> Iterator[DirBlob]:
    """Every rank's staged files of ``step``, in rank order. A part given by path is
    pinned by the rank (hard links of its own) until the caller asks for the next part."""
    if group is None:
        raise CheckpointError(f"the workers are being replaced; the checkpoint of step {step} "
                              "is skipped and the next one is written")
    here = placement.driver_node()
    fetches = [lambda: group.local_runner.staged_files(step, by_path=True)] \
        if group.local_runner is not None else []
    first = len(fetches)
    for rank, actor in enumerate(list(group.actors), start=first):
        # A rank on the driver's node names its files: linked or uploaded from there.
        fetches.append(lambda actor=actor, by_path=group.rank_nodes[rank] == here: ray.get(
            actor.staged_files.remote(step, by_path), timeout=FETCH_TIMEOUT_S))
    for fetch in fetches:
        try:
            part = fetch()
        except Exception as exc:  # a rank's or Ray's error: not the storage's
            raise CheckpointError(f"a rank's staged checkpoint of step {step} could not be "
                                  f"fetched ({type(exc).__name__}: {first_line(exc)})") from exc
        try:
            yield part
        finally:
            unpin(part)


def disk_source(staged: Optional[DiskSchedule], current_group: Callable[[], Any]):
    """The ranks' staged shards where they write them (a sharding strategy's
    ``WorkerSettings.staged_disk``), else the commit's snapshots, fetched to the driver."""
    if staged is not None:
        return StagedShards(lambda step: staged_parts(current_group(), step),
                            stage_now=lambda: current_group().execute("stage_now"))
    return CommitFiles(fetch_to_driver)
