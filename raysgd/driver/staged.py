"""Where the disk writer takes a checkpoint's content from (:func:`disk_source`), and the
files each rank staged for a sharded disk checkpoint (:func:`staged_parts`).

Every rank wrote its part on its own node (``raysgd.worker.staging``); the disk writer's
thread asks for them one rank at a time, so the driver holds one rank's files at once. A
rank on the driver's node sends the files' paths instead (``FileRef``): the store links
them into a local ``checkpoint_dir`` or uploads them from there, with no copy through Ray.
The calls run in the workers' ``staging`` thread, beside training. A step staged anew while
its files were fetched (a state change between calls) could mix two commits' files, so
each rank says which of its stages it served, and is asked again at the end
(:class:`raysgd.errors.StagedCheckpointSuperseded` when any changed).
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional

import ray

from raysgd.driver import placement
from raysgd.driver.watch import fetch_to_driver
from raysgd.errors import CheckpointError, StagedCheckpointSuperseded, first_line
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
    here = placement.driver_node() if group.actors else None
    ranks: List[Any] = [_LocalRank(group.local_runner)] if group.local_runner is not None else []
    first = len(ranks)
    for rank, actor in enumerate(list(group.actors), start=first):
        ranks.append(_RemoteRank(actor, by_path=group.rank_nodes[rank] == here))
    _call(step, _hold, ranks, step)  # before any fetch: no rank rotates the step out meanwhile
    served = []
    for rank in ranks:
        version, part = _call(step, rank.staged_files, step)
        served.append(version)
        try:
            yield part
        finally:
            unpin(part)
    # Fetched one rank at a time: a step staged anew between two fetches leaves the earlier
    # ranks' files older than the later ones'. A rank's stage ends only once every rank has
    # begun it (DCP's save is a collective), so asking every rank again now sees it.
    now = [_call(step, rank.staged_version, step) for rank in ranks]
    if now != served:
        raise StagedCheckpointSuperseded(
            f"step {step} was staged anew while its files were fetched (versions {served} "
            f"then {now}); the write is dropped and tried again")


class _LocalRank:
    """The driver's own rank (``use_local``): on the driver's node, so by path."""

    def __init__(self, runner: Any):
        self.runner = runner

    def staged_files(self, step: int) -> Any:
        return self.runner.staged_files(step, True, True)

    def staged_version(self, step: int) -> Any:
        return self.runner.staged_version(step)

    def hold(self, step: int) -> None:
        self.runner.hold_staged(step)


class _RemoteRank:
    """A rank in a worker process: its actor's ``staging`` thread answers."""

    def __init__(self, actor: Any, by_path: bool):
        self.actor, self.by_path = actor, by_path  # by_path: the rank is on the driver's node

    def staged_files(self, step: int) -> Any:
        return ray.get(self.actor.staged_files.remote(step, self.by_path, True),
                       timeout=FETCH_TIMEOUT_S)

    def staged_version(self, step: int) -> Any:
        return ray.get(self.actor.staged_version.remote(step), timeout=FETCH_TIMEOUT_S)

    def hold(self, step: int) -> Any:
        return self.actor.hold_staged.remote(step)  # every rank's at once (see _hold)


def _hold(ranks: List[Any], step: int) -> None:
    """Every rank keeps ``step`` staged until the next write holds another step."""
    refs = [ref for ref in (rank.hold(step) for rank in ranks) if ref is not None]
    if refs:  # (a local rank held at once)
        ray.get(refs, timeout=FETCH_TIMEOUT_S)


def _call(step: int, fn: Callable, *args) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # a rank's or Ray's error: not the storage's
        raise CheckpointError(f"a rank's staged checkpoint of step {step} could not be "
                              f"fetched ({type(exc).__name__}: {first_line(exc)})") from exc


def disk_source(staged: Optional[DiskSchedule], current_group: Callable[[], Any]):
    """The ranks' staged shards where they write them (a sharding strategy's
    ``WorkerSettings.staged_disk``), else the commit's snapshots, fetched to the driver."""
    if staged is not None:
        return StagedShards(lambda step: staged_parts(current_group(), step),
                            stage_now=lambda: current_group().execute("stage_now"))
    return CommitFiles(fetch_to_driver)
