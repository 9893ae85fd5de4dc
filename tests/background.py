"""Subprocess runs that tests wait for, started ahead of them, ``PARALLEL`` at a time.

Some tests only start a script (an example, a benchmark's quick mode) and check
its output. Such a script mostly starts processes and a Ray of its own one
after the other, which leaves a core of this 2-core machine idle; two of them
side by side fill it. A :class:`Batch` holds a module's (or the session's) runs:
the first ``result(name)`` starts them all, longest first, and each test waits
for its own run and asserts on it what it asserted when it ran the script
itself.

A batch may also start narrower (``start(width=1)``): the session's benchmark
runs start so at the session's start, one at a time beside the rest of the
suite, and widen to ``PARALLEL`` once a test waits for one of them (their
smoke tests run last, when nothing else is left). Such runs get an environment
of their own (``env``, taken before any test changed ``os.environ``) and a Ray
temporary directory of their own (``RAY_TMPDIR``), so neither joins the other's
cluster through ``ray_current_cluster``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

PARALLEL = 2
# Every job's (name, start, end), in seconds since the session began: the suite's time is
# a bar, and the terminal summary (conftest) shows where the background jobs spent it.
SESSION_START = time.monotonic()
RUNS: List[Tuple[str, float, float]] = []


class Batch:
    """Named jobs (``job(batch)`` → anything), run on ``PARALLEL`` threads in the given
    order once the first result is asked for; ``Batch.run`` starts their processes."""

    def __init__(self, jobs: Dict[str, Callable[["Batch"], Any]], parallel: int = PARALLEL,
                 env: Optional[Dict[str, str]] = None):
        self._jobs = dict(jobs)
        self._parallel = parallel
        self.env = env  # the runs' environment (None: this process's at each start)
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="background")
        self._lock = threading.Lock()
        self._futures: Dict[str, Future] = {}
        self._running: List[subprocess.Popen] = []
        self._closed = False
        # Lanes: at most ``_width`` jobs run at once, in the order they were submitted.
        self._lanes = threading.Condition(self._lock)
        self._width = 0
        self._busy = 0
        self._next = 0  # the index of the next job to take a lane

    def start(self, width: Optional[int] = None) -> None:
        """Submit every job; ``width`` of them run at once (default ``parallel``; a started
        batch only ever widens)."""
        with self._lock:
            for name, job in self._jobs.items():
                if name not in self._futures:
                    index = len(self._futures)
                    self._futures[name] = self._pool.submit(self._in_lane, index, name, job)
            self._widen(self._parallel if width is None else width)

    def _widen(self, width: int) -> None:
        self._width = max(self._width, min(width, self._parallel))
        self._lanes.notify_all()

    def _in_lane(self, index: int, name: str, job: Callable[["Batch"], Any]) -> Any:
        with self._lanes:
            self._lanes.wait_for(lambda: self._closed or (
                self._next == index and self._busy < self._width))
            if self._closed:
                raise RuntimeError("the batch was closed before this run started")
            self._next += 1
            self._busy += 1
            self._lanes.notify_all()
        began = time.monotonic() - SESSION_START
        try:
            return job(self)
        finally:
            RUNS.append((name, began, time.monotonic() - SESSION_START))
            with self._lanes:
                self._busy -= 1
                self._lanes.notify_all()

    @property
    def started(self) -> bool:
        return bool(self._futures)

    def result(self, name: str, timeout: Optional[float] = None, widen: bool = True) -> Any:
        """Job ``name``'s return value (its exception is raised here), once it is done.
        ``widen=False``: wait without widening a started batch (a test in the middle of the
        suite, whose foreground must not share the cores with two background runs)."""
        if widen or not self.started:
            self.start()
        return self._futures[name].result(timeout=timeout)

    def wait_all(self) -> None:
        """Until every started job has ended (however it ended)."""
        for future in list(self._futures.values()):
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - its own test reports it
                pass

    def run(self, command: List[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run(command, capture_output=True, text=True, timeout=timeout,
        **kwargs)`` for a job, in a process group of its own: at the timeout (raised as
        ``subprocess.TimeoutExpired``, as ``subprocess.run`` does) or when the batch is
        closed, the whole group is killed, the script's Ray with it."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the batch was closed before this run started")
            # Never env=None: the child would then exec with this process's C environ, which
            # another thread may reallocate meanwhile (a test setting a variable), and a vfork
            # child reading it then fails with EFAULT ("Bad address", seen once). A copy is
            # an array of the starting thread's own.
            kwargs.setdefault("env", dict(os.environ) if self.env is None else self.env)
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True, **kwargs)
            self._running.append(proc)
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            stdout, stderr = proc.communicate()
            raise subprocess.TimeoutExpired(command, timeout, stdout, stderr)
        finally:
            with self._lock:
                self._running.remove(proc)
        return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)

    def close(self) -> None:
        """Kill what still runs (a session cut short); jobs not started yet never start."""
        with self._lock:
            self._closed = True
            self._lanes.notify_all()
            running = list(self._running)
        for proc in running:
            _kill_group(proc)
        self._pool.shutdown(wait=True, cancel_futures=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
