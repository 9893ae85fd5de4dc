"""Fans the trainer's records out to its loggers without ever slowing or
failing training.

``setup`` runs in the caller's thread, so a :class:`~raysgd.errors.ConfigError`
(bad arguments) reaches the user before any work starts. Every other call goes
on a queue that one daemon thread works through in order: a slow tracker
server delays no batch, and a logger that raises is reported once, disabled and
left behind while the others go on.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from raysgd.errors import ConfigError
from raysgd.loggers.base import checked_loggers

log = logging.getLogger("raysgd")

_STOP = object()
EXIT_TIMEOUT_S = 5.0


class LoggerHub:
    """Runs ``loggers`` (Logger instances or look-alikes) in one background thread."""

    def __init__(self, loggers: Optional[Sequence[Any]] = None) -> None:
        self._active: List[Any] = checked_loggers(loggers)
        self.disabled: List[Tuple[Any, BaseException]] = []
        self._lock = threading.Lock()
        self._queue: "queue.Queue[Any]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._set_up = False

    @property
    def loggers(self) -> List[Any]:
        """The loggers still running (not disabled)."""
        with self._lock:
            return list(self._active)

    def setup(self, run_dir: Optional[str], resumed_step: int) -> None:
        """Set every logger up, here and now. A ConfigError is raised (after the
        loggers already set up are finalized); any other error disables its logger."""
        if self._set_up:
            raise RuntimeError("LoggerHub.setup() was already called; call it once per run")
        self._set_up = True
        done: List[Any] = []
        for logger in self.loggers:
            setup = getattr(logger, "setup", None)
            try:
                if callable(setup):
                    setup(run_dir, resumed_step)
                done.append(logger)
            except ConfigError:
                for ready in done:  # e.g. finish a W&B run already started
                    _finalize_quietly(ready)
                self._closed = True
                raise
            except Exception as exc:
                self._disable(logger, "setup", exc)
        if self.loggers and not self._closed:
            # A script that never shuts its trainer down still gets its files
            # closed and its tracker runs finished at interpreter exit.
            atexit.register(self._close_at_exit)

    def log_hyperparams(self, config: Mapping[str, Any]) -> None:
        """Queue ``config`` for every logger (nested dicts are copied now)."""
        self._put(("log_hyperparams", (_copy_dicts(config),)))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Queue one record (a copy, so the caller may reuse its dict)."""
        self._put(("log_metrics", (dict(metrics), step)))

    def call_soon(self, function: Any) -> None:
        """Run ``function()`` on the loggers' thread after what is queued (say, copying
        their files to storage); an error in it is logged, never raised."""
        self._put(("call", (function,)))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued so far ran; False if ``timeout_s`` passed first."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            return True
        drained = threading.Event()
        self._queue.put(drained)
        return drained.wait(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Run what is queued, finalize every logger and stop the thread.

        Idempotent; later ``log_*`` calls are ignored. Gives up (with a warning)
        after ``timeout_s`` rather than hang the trainer's shutdown.
        """
        with self._lock:
            if self._closed:
                return
            self._put_locked(("finalize", ()))
            self._closed = True
            thread = self._thread
        atexit.unregister(self._close_at_exit)
        if thread is None:
            return
        self._queue.put(_STOP)
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("raysgd loggers did not finish within %.0f s; records still queued "
                        "may be lost (a tracker server slow or unreachable?)", timeout_s)

    def _close_at_exit(self) -> None:
        self.close(EXIT_TIMEOUT_S)

    def _put(self, task: Tuple[str, tuple]) -> None:
        with self._lock:
            if not self._closed:
                self._put_locked(task)

    def _put_locked(self, task: Tuple[str, tuple]) -> None:
        if not self._active:
            return  # nothing to run it: no thread needed
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name="raysgd-loggers", daemon=True)
            self._thread.start()
        self._queue.put(task)

    def _work(self) -> None:
        while True:
            task = self._queue.get()
            if task is _STOP:
                return
            if isinstance(task, threading.Event):
                task.set()  # a flush marker: everything before it ran
                continue
            method, args = task
            if method == "call":
                _call_quietly(args[0])
                continue
            for logger in self.loggers:
                try:
                    getattr(logger, method)(*args)
                except Exception as exc:
                    self._disable(logger, method, exc)

    def _disable(self, logger: Any, method: str, exc: BaseException) -> None:
        log.warning("raysgd logger %s.%s raised %s: %s; the logger is disabled for the "
                    "rest of the run, training goes on", type(logger).__name__, method,
                    type(exc).__name__, exc)
        with self._lock:
            self._active = [x for x in self._active if x is not logger]
            self.disabled.append((logger, exc))
        if method != "finalize":
            _finalize_quietly(logger)  # let it close what it opened


def _call_quietly(function: Any) -> None:
    try:
        function()
    except Exception as exc:  # noqa: BLE001 - the loggers' thread must go on
        log.warning("raysgd: %s raised %s: %s", getattr(function, "__qualname__", function),
                    type(exc).__name__, exc)


def _finalize_quietly(logger: Any) -> None:
    try:
        logger.finalize()
    except Exception:  # the logger is already broken; one warning was enough
        pass


def _copy_dicts(value: Any) -> Any:
    # Deep-copying a config would copy models and data sets (or fail on locks);
    # only the dicts can sensibly be mutated by the caller later.
    if isinstance(value, Mapping):
        return {k: _copy_dicts(v) for k, v in value.items()}
    return value
