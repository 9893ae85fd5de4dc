"""Subprocess runs that tests wait for, started at the session's start, beside the other tests.

Some tests only start a script (an example, a benchmark's quick mode) and check
its output. Such a script mostly starts processes and a Ray of its own one
after the other, which leaves a core of this 2-core machine idle, and so do
many in-process tests (a spare importing torch, a hang being waited out). So
the session's :class:`Batch` (``conftest.background``) starts every script run
that the session's tests will ask for when the first test starts, longest
first, one at a time beside the in-process tests; ``conftest`` orders the tests
that wait for a run after all others, and the first ``result(name)`` widens the
batch to ``PARALLEL`` runs at a time, since nothing else runs by then. Each
test waits for its own run and asserts on it what it asserted when it ran the
script itself.

Every run starts a Ray of its own (``RAY_ADDRESS=local``): a cluster that a
test beside it started (``ray.cluster_utils.Cluster`` writes
``/tmp/ray/ray_current_cluster``) must not be joined by a script's
``ray.init()``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

PARALLEL = 2  # runs at a time once only waiting tests are left
BESIDE_TESTS = 1  # runs at a time while other tests run


class Batch:
    """Named jobs (``job(batch)`` → anything), run in the given order once started,
    ``BESIDE_TESTS`` at a time until the first ``result()``, then ``parallel``;
    ``Batch.run`` starts their processes."""

    def __init__(self, jobs: Dict[str, Callable[["Batch"], Any]], parallel: int = PARALLEL,
                 beside_tests: int = BESIDE_TESTS):
        self._jobs = dict(jobs)
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="background")
        self._lock = threading.Lock()
        self._turn = threading.Condition(self._lock)  # who may start: see _admitted
        self._limit, self._parallel = beside_tests, parallel
        self._active = 0
        self._next = 0  # the ticket of the next job to start: jobs start in the given order
        self._futures: Dict[str, Future] = {}
        self._running: List[subprocess.Popen] = []
        self._closed = False

    def start(self) -> None:
        with self._lock:
            for name, job in self._jobs.items():
                if name not in self._futures:
                    ticket = len(self._futures)
                    self._futures[name] = self._pool.submit(self._admitted, ticket, job)

    def _admitted(self, ticket: int, job: Callable[["Batch"], Any]) -> Any:
        with self._turn:
            self._turn.wait_for(lambda: self._closed or (
                ticket == self._next and self._active < self._limit))
            if self._closed:
                raise RuntimeError("the batch was closed before this run started")
            self._next += 1
            self._active += 1
            self._turn.notify_all()
        try:
            return job(self)
        finally:
            with self._turn:
                self._active -= 1
                self._turn.notify_all()

    def widen(self) -> None:
        """``parallel`` runs at a time from now on (only tests that wait are left)."""
        with self._turn:
            self._limit = self._parallel
            self._turn.notify_all()

    @property
    def started(self) -> bool:
        return bool(self._futures)

    def result(self, name: str, timeout: Optional[float] = None) -> Any:
        """Job ``name``'s return value (its exception is raised here), once it is done."""
        self.start()
        self.widen()
        return self._futures[name].result(timeout=timeout)

    def run(self, command: List[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """``subprocess.run(command, capture_output=True, text=True, timeout=timeout,
        **kwargs)`` for a job, with a Ray of its own and in a process group of its own: at
        the timeout (raised as ``subprocess.TimeoutExpired``, as ``subprocess.run`` does)
        or when the batch is closed, the whole group is killed, the script's Ray with it."""
        env = dict(kwargs.pop("env", None) or os.environ, RAY_ADDRESS="local")
        with self._lock:
            if self._closed:
                raise RuntimeError("the batch was closed before this run started")
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, start_new_session=True, env=env, **kwargs)
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
        with self._turn:
            self._closed = True
            running = list(self._running)
            self._turn.notify_all()
        for proc in running:
            _kill_group(proc)
        self._pool.shutdown(wait=True, cancel_futures=True)


class Named:
    """One family of a batch's jobs, asked for by their short names: ``Named(batch,
    "example.").result("digits", timeout)`` is ``batch.result("example.digits", timeout)``."""

    def __init__(self, batch: Batch, prefix: str):
        self.batch, self.prefix = batch, prefix

    def result(self, name: str, timeout: Optional[float] = None) -> Any:
        return self.batch.result(self.prefix + name, timeout)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
