"""Exception types raised by raysgd.

Every error says what was wrong and how to fix it. Worker failures carry the
rank that failed and the worker's traceback so a multi-worker run never reports
a bare "training failed".
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


def first_line(exc: BaseException) -> str:
    """An exception's message up to its first line break (for one-line warnings). A Ray
    task's error gives its cause's: its own first line names only the task."""
    cause = getattr(exc, "cause", None)
    text = str(cause if isinstance(cause, BaseException) else exc).strip()
    return text.splitlines()[0] if text else ""


class RaySGDError(Exception):
    """Base class of every error raised by raysgd itself."""


class ConfigError(RaySGDError, ValueError):
    """A trainer or operator argument is invalid; raised before work starts."""


class CheckpointError(RaySGDError, ValueError):
    """A checkpoint file is missing, truncated, foreign or unsafe to load."""


class StagedCheckpointSuperseded(CheckpointError):
    """A sharded checkpoint's step was staged anew while the driver fetched the ranks'
    files (a state change between calls commits the same step again), so they may not all
    be of one commit: the write is dropped and tried again, never placed."""


class SlabCommitLost(CheckpointError):
    """A commit held in a slab (``raysgd.state.slab``) can no longer be read whole: a newer
    commit overwrote it, or the driver holding the slab is gone."""


class TrainerShutdownError(RaySGDError, RuntimeError):
    """A method was called on a trainer whose workers are gone."""


class ResourcesUnavailableError(RaySGDError, RuntimeError, TimeoutError):
    """The cluster cannot place the requested workers (now, or within the placement timeout).

    Also a ``TimeoutError``, which legacy RaySGD raised and legacy code catches.
    """


@dataclass(frozen=True)
class RankFailure:
    """One rank's part in a failed call: the exception and its traceback text."""

    rank: int
    error: BaseException
    traceback: str = ""
    died: bool = False  # the worker process or its node is gone

    def describe(self) -> str:
        what = "worker died" if self.died else type(self.error).__name__
        first_line = (str(self.error).strip().splitlines() or [""])[0]
        return f"rank {self.rank}: {what}: {first_line}"


class WorkerFailedError(RaySGDError, RuntimeError):
    """Worker processes died or their process group broke.

    ``failures`` holds one :class:`RankFailure` per rank that reported a
    problem, in rank order. This is the *recoverable* kind of failure: user
    exceptions are re-raised with their own type instead.
    """

    def __init__(self, message: str, failures: Sequence[RankFailure] = ()):
        self.failures = tuple(sorted(failures, key=lambda f: f.rank))
        # Wall time the dead ranks last answered the driver (None: unknown); their death
        # came after it, so a recovery counts from there (``recovery_phases``' detect_s).
        self.last_seen: Optional[float] = None
        details = "\n".join("  " + f.describe() for f in self.failures)
        super().__init__(f"{message}\n{details}" if details else message)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(f.rank for f in self.failures)

    def __reduce__(self):
        return (self.__class__, (self.args[0].split("\n")[0], self.failures))


class RetriesExhaustedError(WorkerFailedError):
    """Recovery was attempted ``max_retries`` times and the workers still fail."""
