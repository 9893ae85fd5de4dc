"""The worker side of a function trainable: runs ``func(config, checkpoint_dir)`` in a
thread and hands its reports to the driver one at a time.

The function runs in lockstep with the driver, as Ray 1.x's function trainables did:
``report()`` returns only when the driver asks for the next result, so every rank is
paused between Tune iterations and no rank runs ahead of the trial. Nothing here
imports Ray; :mod:`raysgd.function.hooks` plugs this session into ``tune.report`` /
``ray.train.report``.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import queue
import shutil
import tempfile
import threading
from typing import Any, Callable, Dict, Iterator, Optional

import torch

from raysgd.errors import ConfigError
from raysgd.worker.process_state import on_restore

_active: Optional["FunctionSession"] = None  # the session of this process, if any


def current_session() -> Optional["FunctionSession"]:
    return _active


def is_distributed_trainable() -> bool:
    """True inside a function run by ``DistributedTrainableCreator``."""
    return _active is not None


@on_restore
def reset() -> None:
    """Forget this process's session (a pooled worker starting over for a new trainer)."""
    global _active
    _active = None


def checkpoint_call(func: Callable) -> Callable[[Dict[str, Any], Optional[str]], Any]:
    """How to call ``func`` with ``(config, checkpoint_dir)``: ``func(config)``,
    ``func(config, checkpoint_dir)`` or ``func(config, *, checkpoint_dir)``.

    Raises ConfigError, on the driver, for a signature that cannot be called so.
    """
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{func!r} is not a function raysgd can inspect: {exc}") from exc
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keyword_only = {p.name: p for p in params if p.kind == p.KEYWORD_ONLY}
    needs_other = [name for name, p in keyword_only.items()
                   if p.default is p.empty and name != "checkpoint_dir"]
    if not positional or len(positional) > 2 or needs_other \
            or (len(positional) == 2 and positional[1].name not in ("checkpoint_dir", "checkpoint")):
        raise ConfigError(
            f"A function trainable must look like func(config) or func(config, "
            f"checkpoint_dir=None); {getattr(func, '__name__', func)} takes "
            f"{inspect.signature(func)}.")
    if len(positional) == 2:
        return lambda config, path: func(config, path)
    if "checkpoint_dir" in keyword_only:
        return lambda config, path: func(config, checkpoint_dir=path)
    return lambda config, path: func(config)


class _Finished:
    """The function returned (or raised ``error``)."""

    def __init__(self, error: Optional[BaseException] = None):
        self.error = error


class FunctionSession:
    """One rank's running function: reports flow out, "go on" signals flow in."""

    def __init__(self, func: Callable, config: Dict[str, Any], rank: int, world_size: int,
                 checkpoint_dir: Optional[str] = None):
        self.func, self.config = func, config
        self.rank, self.world_size = rank, world_size
        self.loaded_checkpoint_dir = checkpoint_dir
        self._results: "queue.Queue[Any]" = queue.Queue()
        self._go_on = threading.Semaphore(0)
        self._pending_checkpoint: Optional[str] = None
        self._thread: Optional[threading.Thread] = None
        self.finished = False

    # ------------------------------------------------------- driver's side
    def next_result(self) -> Dict[str, Any]:
        """Let the function run to its next report; returns it (or the end of the function)."""
        if self.finished:
            return {"done": True, "metrics": {}, "checkpoint_dir": None}
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="raysgd-function", daemon=True)
            self._thread.start()
        else:
            self._go_on.release()
        item = self._results.get()
        if isinstance(item, _Finished):
            self.finished = True
            if item.error is not None:
                raise item.error
            return {"done": True, "metrics": {}, "checkpoint_dir": self._take_checkpoint()}
        return {"done": False, "metrics": item, "checkpoint_dir": self._take_checkpoint()}

    def _run(self) -> None:
        global _active
        _active = self
        finished = _Finished()
        try:
            checkpoint_call(self.func)(self.config, self.loaded_checkpoint_dir)
        except BaseException as exc:  # noqa: BLE001 - handed to the driver's call
            finished = _Finished(exc)
        _active = None
        self._results.put(finished)

    # ----------------------------------------------------- function's side
    def report(self, metrics: Dict[str, Any], checkpoint_path: Optional[str] = None) -> None:
        """Hand ``metrics`` (and a checkpoint directory) over; wait until the driver asks again."""
        if not isinstance(metrics, dict):
            raise ConfigError(f"report() takes a dict of metrics, got {type(metrics).__name__}.")
        if checkpoint_path is not None and self.rank == 0:
            self._pending_checkpoint = checkpoint_path
        self._results.put(dict(metrics))
        self._go_on.acquire()

    def add_checkpoint(self, path: str) -> None:
        """Rank 0's finished checkpoint directory; it travels with the next report."""
        self._pending_checkpoint = path

    def _take_checkpoint(self) -> Optional[str]:
        path, self._pending_checkpoint = self._pending_checkpoint, None
        return path


@contextlib.contextmanager
def distributed_checkpoint_dir(step: Any, disable: bool = False) -> Iterator[str]:
    """A directory to write a checkpoint into; only rank 0's is kept.

    Rank 0's directory becomes the trial's checkpoint with the next report (Tune
    saves it, and a restored trial's function gets it as ``checkpoint_dir``);
    every other rank gets a throwaway directory that is deleted on exit::

        with distributed_checkpoint_dir(step=epoch) as path:
            torch.save(model.state_dict(), os.path.join(path, "checkpoint"))
    """
    keep = torch.distributed.get_rank() == 0 and not disable
    path = tempfile.mkdtemp(prefix=f"raysgd_checkpoint_{step}_")
    try:
        yield path
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    if not keep:
        shutil.rmtree(path, ignore_errors=True)
    elif _active is not None:
        _active.add_checkpoint(path)


@contextlib.contextmanager
def distributed_checkpoint(label: Any, disable: bool = False) -> Iterator[str]:
    """Ray 0.8's form: a file path to ``torch.save`` into (``os.devnull`` off rank 0)."""
    if torch.distributed.get_rank() != 0 or disable:
        yield os.devnull
        return
    with distributed_checkpoint_dir(label) as path:
        yield os.path.join(path, "checkpoint")
