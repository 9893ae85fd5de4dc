"""What a run leaves behind: disk checkpoints, the resume point, logged metrics.

The trainer turns its ``checkpoint_dir``/``loggers`` arguments into one
:class:`RunRecorder` at construction and tells it about every commit and
every call's result; the recorder owns the :class:`DiskCheckpointer` and the
:class:`LoggerHub`. Without a checkpoint directory the checkpointer is a
:class:`NullCheckpointer`, and without loggers the hub does nothing, so the
trainer never asks which mode it is in.
"""
from __future__ import annotations

import logging
import numbers
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Union

from raysgd.errors import ConfigError
from raysgd.loggers import CSVLogger, LoggerHub
from raysgd.state.checkpoint_dir import CheckpointDirectory, owned_by_checkpoints
from raysgd.state.commit_files import to_snapshots
from raysgd.state.disk_checkpoints import DiskCheckpointer, ScoreRule, check_compatible, operator_name
from raysgd.state.disk_schedule import DiskSchedule
from raysgd.storage.mirror import LogMirror
from raysgd.storage.probe import check_store
from raysgd.storage.store import Store, local_path, open_store
from raysgd.worker.metrics import NUM_SAMPLES

logger = logging.getLogger("raysgd")

PREFIXES = {"train": ("train_", ("train_",)), "validate": ("val_", ("val_", "validation_"))}


@dataclass(frozen=True)
class DiskSettings:
    """The validated disk-checkpoint arguments of a ``TorchTrainer``; ``store`` is where
    ``checkpoint_dir`` is (local disk or a ``pyarrow.fs`` filesystem), checked to take
    writes."""

    store: Optional[Store]
    keep: Optional[int]
    every_n_steps: Optional[int]
    resume: bool
    score: Optional[ScoreRule]

    @classmethod
    def create(cls, checkpoint_dir: Any, keep_checkpoints: Any, every_n_steps: Any, resume: Any,
               score_attr: Any, score_mode: Any, commit_every: Union[int, str, None],
               in_process: bool = False, filesystem: Any = None) -> "DiskSettings":
        """``in_process``: one rank, in the driver, which takes no in-epoch commits;
        ``filesystem``: ``storage_filesystem``, a ``pyarrow.fs.FileSystem``."""
        if checkpoint_dir is None:
            for name, value in (("checkpoint_every_n_steps_to_disk", every_n_steps),
                                ("checkpoint_score_attr", score_attr),
                                ("storage_filesystem", filesystem)):
                if value is not None:
                    raise ConfigError(f"{name} needs a directory to write to: pass "
                                      "TorchTrainer(checkpoint_dir=...).")
            return cls(None, None, None, False, None)
        _check_positive("keep_checkpoints", keep_checkpoints, none_means="keep every checkpoint")
        _check_positive("checkpoint_every_n_steps_to_disk", every_n_steps,
                        none_means="write only when a train() call ends")
        if every_n_steps is not None:
            _check_in_epoch_commits(every_n_steps, commit_every, in_process)
        if not isinstance(resume, bool):
            raise ConfigError(f"resume must be True or False, got {resume!r}.")
        score = ScoreRule.create(score_attr, score_mode)
        store = open_store(checkpoint_dir, filesystem)
        check_store(store)  # last: the only check that may take seconds
        return cls(store, keep_checkpoints, every_n_steps, resume, score)

    def staged(self, strategy: Any) -> Optional[DiskSchedule]:
        """The ranks' own disk schedule, where a sharding strategy has every rank write its
        shards of ``checkpoint_dir``'s checkpoints (none without a directory)."""
        if self.store is None or not strategy.stages_disk_checkpoints:
            return None
        return DiskSchedule(self.every_n_steps)


def _check_positive(name: str, value: Any, none_means: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)
                              or value < 1):
        raise ConfigError(f"{name} must be a positive integer or None ({none_means}), "
                          f"got {value!r}.")


def _check_in_epoch_commits(every_n_steps: int, commit_every: Union[int, str, None],
                            in_process: bool) -> None:
    """Only in-epoch commits reach the disk inside an epoch: they must exist and line up."""
    if in_process:
        raise ConfigError("checkpoint_every_n_steps_to_disk needs in-epoch commits, which a "
                          "single worker in the driver (num_workers=1, use_local=True) does not "
                          "take; use use_local=False, or drop the argument (a checkpoint is "
                          "still written at the end of every train() call).")
    if not commit_every:
        raise ConfigError("checkpoint_every_n_steps_to_disk needs in-epoch commits, but "
                          "checkpoint_every_n_steps=None turned them off; pass e.g. "
                          f"checkpoint_every_n_steps={every_n_steps}.")
    if isinstance(commit_every, int) and every_n_steps % commit_every:  # "auto" aligns itself
        raise ConfigError(
            f"checkpoint_every_n_steps_to_disk={every_n_steps} must be a multiple of "
            f"checkpoint_every_n_steps={commit_every}: only commits reach the disk. Use e.g. "
            f"checkpoint_every_n_steps_to_disk={commit_every * max(1, every_n_steps // commit_every)}.")


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a trainer starts from: where it is and what it holds."""

    path: str
    step: int
    epoch: int
    snapshots: List[Dict[str, Any]]


class NullCheckpointer:
    """The checkpointer of a trainer without ``checkpoint_dir``: does nothing."""

    def commit_moved(self, commit: Any, in_epoch: bool) -> None:
        pass

    def result(self, phase: str, metrics: Dict[str, Any], commit: Any) -> None:
        pass

    def flush(self, timeout_s: Optional[float] = None) -> bool:
        return True

    def close(self, timeout_s: Optional[float] = None) -> None:
        pass

    def held(self) -> list:
        return []


class RunRecorder:
    """A trainer's run directory and loggers: ``open`` before the workers start (resume
    point, logger set-up), ``start`` once they run, then commits and results, ``close``."""

    def __init__(self, disk: DiskSettings, operator_cls: type, loggers: Optional[Sequence]):
        self.disk = disk
        self.operator = operator_name(operator_cls)
        self.directory = CheckpointDirectory(disk.store, disk.keep) if disk.store else None
        if loggers is None and disk.store:
            loggers = [CSVLogger()]  # metrics.csv next to the checkpoints
        self.hub = LoggerHub(loggers)
        # Loggers write files: on remote storage into a local copy that is mirrored there.
        self.mirror = LogMirror(disk.store, owned_by_checkpoints) \
            if disk.store is not None and not disk.store.local and self.hub.loggers else None
        self.checkpointer: Any = NullCheckpointer()
        self._resumed_step: Optional[int] = None

    def open(self, config: Dict[str, Any]) -> Optional[ResumePoint]:
        """Before any worker starts: find the resume point and set the loggers up."""
        point = self._resume_point()
        self._resumed_step = point.step if point else None
        if self.mirror is not None:
            self.mirror.pull()
        self.hub.setup(self.mirror.local_dir if self.mirror else
                       local_path(self.disk.store) if self.disk.store else None,
                       point.step if point else 0)
        self.hub.log_hyperparams(config)
        return point

    def _resume_point(self) -> Optional[ResumePoint]:
        """The newest readable checkpoint to resume from (checked against the operator), if any."""
        if self.directory is None or not self.disk.resume:
            return None
        found = self.directory.load_latest()
        if found is None:
            return None
        state, entry = found
        path = self.directory.location(entry["file"])
        meta, snapshots = to_snapshots(state)
        check_compatible(meta, self.operator, path)
        return ResumePoint(path, int(meta.get("step", 0)), int(meta.get("epoch", 0)), snapshots)

    def start(self, source: Any) -> None:
        """Workers are up (and resumed): start writing checkpoints, whose content comes from
        ``source`` (``raysgd.state.commit_files.CommitFiles`` or ``disk_checkpoints.StagedShards``)."""
        if self.directory is not None:
            self.checkpointer = DiskCheckpointer(self.directory, source, self.operator,
                                                 self.disk.every_n_steps, self.disk.score,
                                                 resumed_step=self._resumed_step)

    def commit_moved(self, commit: Any, in_epoch: bool) -> None:
        self.checkpointer.commit_moved(commit, in_epoch)

    def held_commits(self) -> list:
        """The commits the disk writer has yet to write (their slabs must stay)."""
        return self.checkpointer.held()

    def save_now(self, commit: Any, seconds_left: Optional[float]) -> None:
        """The driver's node drains: ``commit`` to storage before the node goes."""
        if self.directory is None:
            logger.warning("raysgd: the driver's node drains and this trainer has no "
                           "checkpoint_dir, so its state goes with the node; pass "
                           "checkpoint_dir= (storage that outlives the node, e.g. s3://...)")
            return
        timeout = max(1.0, 0.8 * seconds_left) if seconds_left is not None else 120.0
        if self.checkpointer.save_now(commit, timeout):
            logger.warning("raysgd: the checkpoint of step %d is in %s; once this driver is "
                           "gone, run the same script on a new cluster to resume from it",
                           commit.step, self.directory.path)
        else:
            logger.warning("raysgd: the checkpoint of step %d did not reach %s within %.0f s",
                           commit.step, self.directory.path, timeout or 0)

    def record(self, phase: str, metrics: Dict[str, Any], step: int, epoch: int,
               seconds: float, commit: Any) -> None:
        """A train/validate call's reduced metrics: to the loggers, and scored for ``best``."""
        self.checkpointer.result(phase, metrics, commit)
        self.hub.log_metrics(log_record(phase, metrics, epoch, seconds), step)
        if self.mirror is not None:
            self.hub.call_soon(self.mirror.push)

    def close(self) -> List[int]:
        """Write the last checkpoint and close the loggers; returns the steps whose
        checkpoints never reached the storage (it failed)."""
        unwritten = self.checkpointer.close() or []
        self.hub.close()
        if self.mirror is not None:
            self.mirror.close()
            self.mirror = None
        return unwritten


def log_record(phase: str, metrics: Dict[str, Any], epoch: int, seconds: float) -> Dict[str, Any]:
    """Flat numbers for the loggers: keys prefixed by phase, plus epoch and samples/s.

    ``last_*`` values and non-numbers (profiles) are left out; the epoch is
    the number of passes finished, so train and validation of one epoch line up.
    """
    prefix, known = PREFIXES[phase]
    record: Dict[str, Any] = {"epoch": epoch}
    for key, value in metrics.items():
        if key == "epoch" or key.startswith("last_") or isinstance(value, bool) or \
                not isinstance(value, numbers.Number):
            continue
        record[key if key.startswith(known) else prefix + key] = value
    samples = metrics.get(NUM_SAMPLES)
    if isinstance(samples, numbers.Number) and seconds > 0:
        record[prefix + "samples_per_s"] = samples / seconds
    return record
