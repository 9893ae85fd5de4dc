"""A rank's sharded disk checkpoints, staged on its own node until the driver takes them.

Under a sharding strategy with ``checkpoint_dir``, no rank holds the whole state, so the
ranks write the checkpoint themselves: at each commit the driver's disk rule picks
(``raysgd.state.disk_schedule.DiskSchedule``, the driver's own), every rank saves its
shards with DCP (a collective) and its own small part into a local directory, and the
driver's disk writer fetches the files (``staged_files``, from the actor's ``staging``
thread) into ``checkpoint_dir``. The newest ``KEEP`` steps stay staged; the driver takes a
step soon after its commit, and first ``hold`` s it on every rank: a step being written
is never rotated out, however slow the storage (one rank's part may take longer to upload
than the ranks take to stage ``KEEP`` newer steps).

DCP may write the shards in the background (``raysgd.worker.dcp_io.save``; on GPUs by
default): a staged step is complete once its write is, and ``staged_files`` waits for that
on the actor's ``staging`` thread, never on the training thread.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time
from typing import IO, Any, Callable, Dict, Optional, Set, Tuple

from raysgd.errors import CheckpointError
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.dirblob import DirBlob, pack_dir, pin_files
from raysgd.state.disk_schedule import DiskSchedule
from raysgd.state.sharded_dir import RANK_FILE, SHARDED_KEY

KEEP = 3
READ_WAIT_S = 240.0  # a reader waits this long for a step being staged (driver's fetch: 300 s)
NO_WRITE: tuple = (None, None)  # a step with no staged write: (write, version)
CLOSE_WAIT_S = 2.0  # a write still running at close (a peer died mid-write) is abandoned
PREFIX = "raysgd-staged-"
OWNER = ".owner"  # locked (flock) by the owning process for as long as it lives


class NoStaging:
    """The driver writes the checkpoints (or there is no ``checkpoint_dir``)."""

    def stage(self, step: int, call_end: bool, state: Dict[str, Any],
              save_shards: Callable[[str], Any], keep_existing: bool = False) -> None:
        pass

    def hold(self, step: int) -> None:
        self.staged_files(step)  # refused, as a fetch is

    def staged_files(self, step: int, by_path: bool = False) -> DirBlob:
        raise CheckpointError("this rank stages no disk checkpoints (it runs without "
                              "checkpoint_dir or under a replicated strategy)")

    def close(self) -> None:
        pass


class DiskStaging:
    """Staged checkpoints of one rank: ``<tmp>/raysgd-staged-*/step-<step>/``."""

    def __init__(self, schedule: DiskSchedule, rank: int):
        self.schedule = schedule
        self.rank = rank
        remove_orphans(tempfile.gettempdir())
        self.root = tempfile.mkdtemp(prefix=PREFIX)
        self._owner = _own(self.root)
        # The training thread stages, the actor's staging thread reads: under this condition
        # (``_writes`` changes on the training thread only, so it may read it without).
        self._cond = threading.Condition()
        # staged step -> (its write: wait() once complete, which stage of this rank it is)
        self._writes: Dict[int, Tuple[Any, Optional[int]]] = {}
        self._staged = 0  # stages so far
        self._in_progress: Set[int] = set()  # steps being staged (maybe again) right now
        self._held: Optional[int] = None  # the step the driver writes: kept past KEEP
        self._closed = False

    def stage(self, step: int, call_end: bool, state: Dict[str, Any],
              save_shards: Callable[[str], Any], keep_existing: bool = False) -> None:
        """Stage the commit of ``step`` if it goes to disk (and, with ``keep_existing``, is
        not staged already): ``save_shards(path)`` starts
        writing the models and optimizers with DCP and returns the write (its ``extra``:
        what a load needs besides the files; a plain dict when written already), ``state``
        (the commit's content) gives the rest."""
        if not self.schedule.due(step, call_end) or (keep_existing and step in self._writes):
            return  # (every rank stages the same steps, so all skip alike)
        try:
            with self._cond:
                # the same step again (a state change): the old write is awaited, then replaced
                earlier = self._writes.pop(step, NO_WRITE)[0]
                self._in_progress.add(step)  # a reader of the step waits for its new files
            if earlier is not None:
                _wait(earlier)
            self._write_step(step, state, save_shards)
        finally:
            with self._cond:
                self._in_progress.discard(step)
                self._cond.notify_all()

    def _write_step(self, step: int, state: Dict[str, Any],
                    save_shards: Callable[[str], Any]) -> None:
        path = self._path(step)
        shutil.rmtree(path, ignore_errors=True)  # also what a failed stage left
        os.makedirs(path)
        write = save_shards(path)  # every rank at the same commit: DCP plans collectively
        part = {key: value for key, value in state.items() if key != "shards"}
        if self.rank == 0:  # with what the whole checkpoint holds, as rank 0's commit does
            shards = state.get("shards", {})
            part[SHARDED_KEY] = {"models": len(shards.get("models", [])),
                                 "optimizers": len(shards.get("optimizers", [])),
                                 **(getattr(write, "extra", write) or {})}
        checkpoint_io.write_atomic(os.path.join(path, RANK_FILE.format(rank=self.rank)),
                                   checkpoint_io.to_bytes(part), sync=False)  # see dcp_io
        with self._cond:
            self._staged += 1
            self._writes[step] = (write, self._staged)
            for old in sorted(self._writes)[:-KEEP]:  # done: one write runs at a time
                if old != self._held:
                    self._writes.pop(old)
                    shutil.rmtree(self._path(old), ignore_errors=True)

    def _missing(self, step: int) -> CheckpointError:
        return CheckpointError(f"rank {self.rank} has no staged checkpoint of step {step} "
                               f"(it keeps steps {sorted(self._writes)})")

    def hold(self, step: int) -> None:
        """Keep ``step`` staged, past ``KEEP`` newer steps, until another step is held: the
        driver's writer holds the step it writes on every rank before it fetches any rank's
        files (it writes one step at a time, so the one before is done with)."""
        with self._cond:
            if step not in self._writes and step not in self._in_progress:
                raise self._missing(step)
            self._held = step

    def staged_files(self, step: int, by_path: bool = False, with_version: bool = False) -> Any:
        """The files of ``step`` (their paths with ``by_path``: a reader on this node); with
        ``with_version``, ``(version, files)``: which stage of this rank they are (see
        :meth:`staged_version`).

        A step being staged again (a state change between calls, such as
        ``apply_all_operators``, commits the same step anew) is waited for and served in its
        new version; so is a version replaced while its write was awaited."""
        deadline = time.monotonic() + READ_WAIT_S
        while True:
            with self._cond:
                if not self._cond.wait_for(
                        lambda: step not in self._in_progress or self._closed,
                        max(0.0, deadline - time.monotonic())):
                    raise CheckpointError(f"rank {self.rank} has been staging step {step} for "
                                          f"over {READ_WAIT_S:.0f} s; its checkpoint is skipped")
                write, version = self._writes.get(step, NO_WRITE)
                if write is None:
                    raise self._missing(step)
            try:
                _wait(write)  # the shards' write may still run: here, on the staging thread
            except Exception:
                if self.staged_version(step) == version:
                    raise  # this version's write failed, and no newer one replaces it
                continue
            with self._cond:
                if step in self._in_progress or self._writes.get(step, NO_WRITE)[0] is not write:
                    continue  # replaced while this waited: serve the new version
                if by_path:  # hard links: valid however this rank rotates or replaces the step
                    files = pin_files(self._path(step), self.root)
                else:
                    files = pack_dir(self._path(step))
                return (version, files) if with_version else files

    def staged_version(self, step: int) -> Optional[int]:
        """Which of this rank's stages ``step``'s files are now (None while it is staged
        again, or gone). The driver asks each rank again once it has every rank's files: a
        version changed since its fetch means the step was staged anew meanwhile, so the
        ranks' files may not all be of one commit."""
        with self._cond:
            return None if step in self._in_progress else self._writes.get(step, NO_WRITE)[1]

    def close(self) -> None:
        with self._cond:
            writes, self._writes = [write for write, _ in self._writes.values()], {}
            self._closed = True
            self._cond.notify_all()
        for write in writes:
            with contextlib.suppress(Exception):
                _wait(write, CLOSE_WAIT_S)
        shutil.rmtree(self.root, ignore_errors=True)
        self._owner.close()

    def _path(self, step: int) -> str:
        return os.path.join(self.root, f"step-{step}")


def _wait(write: Any, timeout_s: Optional[float] = None) -> None:
    """Wait for a staged write (``dcp_io.ShardWrite``; a plain dict was written at once)."""
    if hasattr(write, "wait"):
        write.wait(timeout_s)


def _own(root: str) -> IO:
    """Lock ``root``'s owner file for this process's life (the kernel drops the lock however
    the process ends). Locked before it gets its name, so no one sees it unlocked."""
    path = os.path.join(root, OWNER)
    handle = open(path + ".new", "w")
    fcntl.flock(handle, fcntl.LOCK_EX)
    os.rename(path + ".new", path)
    return handle


def remove_orphans(tmp: str) -> None:
    """Remove the staging directories whose process is gone: a SIGKILLed rank (or a rank
    whose driver was killed) never runs ``close``, and its shards would stay forever. A
    directory without an owner file (still being made, or another layout) is left alone."""
    try:
        names = [name for name in os.listdir(tmp) if name.startswith(PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(tmp, name)
        try:
            handle = open(os.path.join(path, OWNER))
        except OSError:
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its owner lives (or the lock cannot be judged)
            shutil.rmtree(path, ignore_errors=True)


def create_staging(schedule: Optional[DiskSchedule], rank: int):
    return DiskStaging(schedule, rank) if schedule is not None else NoStaging()
