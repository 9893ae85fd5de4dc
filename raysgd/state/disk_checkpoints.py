"""Commits to disk, off the training path, and back on resume.

The supervisor's commits already sit in the object store; a
:class:`DiskCheckpointer` writes them into a :class:`CheckpointDirectory`
from one background thread on the driver, so training never waits for the
disk. Commits arriving faster than the disk takes them are coalesced: the
newest pending one replaces an older one that was not written yet (it holds
everything the older one did). No Ray here: the trainer chooses the source
of a checkpoint's content once, from the strategy.

:class:`raysgd.state.commit_files.CommitFiles` (replicated strategies): one file, what
``save`` writes. :class:`StagedShards` (sharding strategies): a DCP directory
(``raysgd.state.sharded_dir``) of the files each rank staged for the commit's step. A
source gives a job's ``content`` and ``release`` s it after the write.
"""
from __future__ import annotations

import atexit
import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from raysgd.errors import CheckpointError, ConfigError, StagedCheckpointSuperseded, first_line
from raysgd.state.checkpoint_dir import CheckpointDirectory
from raysgd.state.commit import Commit
from raysgd.state.dirblob import DirBlob
from raysgd.state.disk_schedule import DiskSchedule
from raysgd.state.sharded_dir import write_dir
from raysgd.state.write_queue import Job, WriteQueue

logger = logging.getLogger("raysgd")

SETTLE_S = 0.03  # a write starts this long after its commit arrived (see _run)
SCORE_MODES = ("min", "max", "auto")
# Metric names that "auto" scores as lower-is-better; anything else is higher-is-better.
LOWER_IS_BETTER = ("loss", "error", "mse", "mae", "rmse", "perplexity")


def operator_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class ScoreRule:
    """Which metric makes a checkpoint the ``best``, and whether lower is better."""

    attr: str
    mode: str  # "min" or "max"

    @classmethod
    def create(cls, attr: Optional[str], mode: str = "auto") -> Optional["ScoreRule"]:
        """``attr`` may carry Tune's ``"min-"``/``"max-"`` prefix instead of ``mode``."""
        if attr is None:
            return None
        if not isinstance(attr, str) or not attr:
            raise ConfigError(f"checkpoint_score_attr must be a metric name such as 'val_loss', "
                              f"got {attr!r}.")
        if mode not in SCORE_MODES:
            raise ConfigError(f"checkpoint_score_mode={mode!r} is not valid; use 'min', 'max' or "
                              f"'auto' (min for names containing any of {list(LOWER_IS_BETTER)}).")
        prefix, _, rest = attr.partition("-")
        if prefix in ("min", "max") and rest:
            if mode not in ("auto", prefix):
                raise ConfigError(f"checkpoint_score_attr={attr!r} says {prefix!r} but "
                                  f"checkpoint_score_mode={mode!r}; give one of them.")
            attr, mode = rest, prefix
        if mode == "auto":
            mode = "min" if any(word in attr for word in LOWER_IS_BETTER) else "max"
        return cls(attr, mode)

    def better(self, score: float, best: Optional[float]) -> bool:
        if math.isnan(score):
            return False
        return best is None or (score < best if self.mode == "min" else score > best)


class StagedShards:
    """A sharded checkpoint directory of the files every rank staged on its own node for
    the commit's step; ``fetch_staged(step)`` yields them one rank at a time."""

    def __init__(self, fetch_staged: Callable[[int], Iterable[DirBlob]],
                 stage_now: Callable[[], Any] = lambda: None):
        self.fetch_staged = fetch_staged
        self.stage_now = stage_now  # every rank stages the current step, off schedule

    def content(self, commit: Commit, meta: Dict[str, Any],
                store: Any) -> Callable[[Any, str], str]:
        return lambda store, rel: write_dir(self.fetch_staged(commit.step), meta, store, rel)

    def release(self, content: Any) -> None:
        """Nothing to free: the ranks' staged files are theirs."""


class DiskCheckpointer:
    """Writes the trainer's commits to ``directory`` from one background thread."""

    def __init__(self, directory: CheckpointDirectory, source: Any,
                 operator: str, every_n_steps: Optional[int] = None,
                 score: Optional[ScoreRule] = None, resumed_step: Optional[int] = None):
        """``resumed_step``: the step this run resumed at (None: a fresh run)."""
        self.directory = directory
        self.source = source  # CommitFiles or StagedShards
        self.operator = operator
        self.schedule = DiskSchedule(every_n_steps)  # the ranks stage by the same rule
        self.score = score
        self.best_score = self._inherited_best(resumed_step)
        self._score_seen = False
        self.last_path: Optional[str] = None
        self.write_seconds: List[float] = []  # wall time of each write
        self.write_cpu_seconds: List[float] = []  # the writer thread's CPU time of each
        self._queue = WriteQueue()  # pending commits, retries, what never got written
        self._closing = False
        self._cond = threading.Condition()
        self._busy = False
        self._writing: Optional[Commit] = None  # the commit being written
        self._closed = False
        self._flushing = 0  # callers waiting in flush(): write without the settle delay
        self._thread = threading.Thread(target=self._run, name="raysgd-checkpoint-writer",
                                        daemon=True)
        self._thread.start()
        # A script that ends without shutdown() still gets its last checkpoint on disk.
        ref = weakref.ref(self)
        self._atexit = lambda: ref() is not None and ref().close()
        atexit.register(self._atexit)

    def _inherited_best(self, resumed_step: Optional[int]) -> Optional[float]:
        """The best score to beat: the resumed run's, unless it was scored after the
        resume point (a timeline the resume abandoned) or under another rule."""
        best = self.directory.best() if self.score else None
        if not best or resumed_step is None or best.get("step", 0) > resumed_step:
            return None
        same_rule = best.get("attr") == self.score.attr and best.get("mode") == self.score.mode
        return best["score"] if same_rule else None

    # ------------------------------------------------------- driver thread
    def commit_moved(self, commit: Commit, in_epoch: bool) -> None:
        """A new commit: written at call ends, and inside a call at multiples of
        ``every_n_steps`` (``DiskSchedule``)."""
        if not self.schedule.due(commit.step, call_end=not in_epoch):
            return
        # A call-end commit arrives just as the driver dispatches the next call (see _run);
        # an in-epoch one is written at once: it bounds what a killed driver loses.
        self._submit("latest", commit, None, settle=not in_epoch)

    def result(self, phase: str, metrics: Dict[str, Any], commit: Optional[Commit]) -> None:
        """A call's reduced metrics: the commit becomes ``best`` when its score improved."""
        if self.score is None or commit is None:
            return
        value = metrics.get(self.score.attr)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            if phase == "validate" and not self._score_seen:
                self._score_seen = True  # warn once
                logger.warning("raysgd: checkpoint_score_attr=%r is not among the metrics of "
                               "validate() (%s), so no best.pt is kept; pass one of them",
                               self.score.attr, sorted(metrics))
            return
        self._score_seen = True
        if self.score.better(float(value), self.best_score):
            self.best_score = float(value)
            self._submit("best", commit, float(value), settle=True)

    def held(self) -> List[Commit]:
        """The commits pending or being written (``raysgd.driver.slabs`` keeps their slabs)."""
        with self._cond:
            return [job.commit for job in self._queue.pending.values()] + \
                ([self._writing] if self._writing is not None else [])

    @property
    def failed_tries(self) -> int:
        return self._queue.failed_tries

    @property
    def never_written(self) -> List[int]:
        """Steps whose checkpoints the storage never took (failed, then replaced)."""
        return self._queue.unwritten()

    def save_now(self, commit: Commit, timeout_s: Optional[float]) -> bool:
        """Write ``commit`` whatever the schedule (the driver's node drains) and wait for
        it; True once it is in the storage."""
        if self._queue.landed.get("latest") is not commit:
            getattr(self.source, "stage_now", lambda: None)()  # sharded: the ranks stage it
            self._submit("latest", commit, None, settle=False)
            self.flush(timeout_s)
        return self._queue.landed.get("latest") is commit

    def flush(self, timeout_s: Optional[float] = None) -> bool:
        """Wait until every submitted checkpoint is written; True if it is."""
        with self._cond:
            self._flushing += 1
            self._cond.notify_all()
            try:
                return self._cond.wait_for(lambda: not self._queue.pending and not self._busy,
                                           timeout_s)
            finally:
                self._flushing -= 1

    def close(self, timeout_s: Optional[float] = 120.0) -> List[int]:
        """Write what is pending (a write the storage keeps failing is tried once more),
        stop the thread; returns the steps whose checkpoints never reached the storage."""
        if self._closed:
            return self.never_written
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if not self.flush(timeout_s):
            logger.warning("raysgd: the checkpoint writer did not finish within %.0f s; the "
                           "last checkpoint in %s may be older", timeout_s, self.directory.path)
        with self._cond:
            self._closed = True
            self._queue.abandon()
            self._cond.notify_all()
        atexit.unregister(self._atexit)
        if self.never_written:
            logger.warning("raysgd: the checkpoints of step(s) %s never reached %s (the storage "
                           "failed); the newest checkpoint there is older",
                           self.never_written, self.directory.path)
        return self.never_written

    def _submit(self, kind: str, commit: Commit, score: Optional[float], settle: bool) -> None:
        not_before = time.monotonic() + SETTLE_S if settle else 0.0
        with self._cond:
            if not self._closed:
                self._queue.submit(kind, commit, score, not_before)
                self._cond.notify_all()

    # ------------------------------------------------------- writer thread
    def _run(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
                if job is None:
                    return
                kind, job = job
                self._busy, self._writing = True, job.commit
            try:
                self._write(kind, job.commit, job.score)
                with self._cond:
                    if self._queue.wrote(kind, job):
                        logger.warning("raysgd: %s takes checkpoints again", self.directory.path)
            except StagedCheckpointSuperseded as exc:  # fetched mid-restage: again, at once
                logger.debug("raysgd: %s", exc)
                with self._cond:
                    if kind not in self._queue.pending:  # (a newer commit of its kind wins)
                        self._queue.submit(kind, job.commit, job.score, 0.0)
            except OSError as exc:  # the storage failed: tried again, training goes on
                self._retry(kind, job, exc)
            except Exception as exc:  # noqa: BLE001 - the disk must never stop training
                logger.warning("raysgd: could not write a checkpoint to %s (%s: %s); training "
                               "goes on and the next commit is tried", self.directory.path,
                               type(exc).__name__, exc)
            finally:
                with self._cond:
                    self._busy, self._writing = False, None
                    self._cond.notify_all()

    def _next_job(self) -> Optional[Tuple[str, Job]]:
        """Under the lock: wait for the job due first, re-picking whenever anything changes
        (a newer commit, a flush, a close); None once closed with nothing left.

        A call-end commit arrives as the call returns, just when the driver dispatches the
        next one; writing at once competes with that for the GIL and the CPU (2-3 % of a
        0.1 s digits epoch on 2 cores, against under 1.5 % when the write starts 30 ms
        later), so it waits ``SETTLE_S`` unless someone flushes."""
        while True:
            kind, wait = self._queue.next(time.monotonic(), self._flushing > 0, self._closing)
            if kind is None:
                if self._closed:
                    return None
                self._cond.wait()
            elif wait > 0:
                self._cond.wait(wait)
            else:
                return kind, self._queue.pop(kind)

    def _retry(self, kind: str, job: Job, exc: OSError) -> None:
        with self._cond:
            first = self._queue.failed_tries == 0
            delay = self._queue.failed(kind, job, time.monotonic(), self._closing)
            if first or delay is None:
                logger.warning("raysgd: the storage %s failed a checkpoint write (%s: %s); "
                               "training goes on, %s", self.directory.path, type(exc).__name__,
                               first_line(exc), "retrying with backoff (first in "
                               f"{delay:.0f} s)" if delay is not None else "giving up on it")

    def _write(self, kind: str, commit: Commit, score: Optional[float]) -> None:
        start, cpu_start = time.perf_counter(), time.thread_time()
        meta = {"operator": self.operator, "world_size": commit.world_size,
                "step": commit.step, "epoch": commit.epochs_done, "time": time.time()}
        data = self.source.content(commit, meta, self.directory.store)
        try:
            if kind == "best":
                self.last_path = self.directory.write_best(data, meta, self.score.attr,
                                                           self.score.mode, score)
            else:
                self.last_path = self.directory.write(data, meta)
        finally:
            self.source.release(data)
        self.write_seconds.append(time.perf_counter() - start)
        self.write_cpu_seconds.append(time.thread_time() - cpu_start)


def check_compatible(meta: Dict[str, Any], operator: str, path: str) -> None:
    """Refuse a checkpoint written for another operator class, naming both."""
    written_by = meta.get("operator")
    if written_by is not None and written_by != operator:
        raise CheckpointError(
            f"The checkpoint {path} was written by {written_by}, but this trainer runs "
            f"{operator}. Resume with the operator that wrote it, or start over with "
            "resume=False or another checkpoint_dir.")
