"""Subprocess runs that tests wait for, started ahead of them, ``PARALLEL`` at a time.

Some tests only start a script (an example, a benchmark's quick mode) and check
its output. Such a script mostly starts processes and a Ray of its own one
after the other, which leaves a core of this 2-core machine idle; two of them
side by side fill it. A :class:`Batch` holds a module's (or the session's) runs:
the first ``result(name)`` starts them all, longest first, and each test waits
for its own run and asserts on it what it asserted when it ran the script
itself. Only runs with a Ray of their own (no ``ray start`` cluster: those a
local ``ray.init()`` could join) go in a batch, and only tests that wait for
nothing else; the rest of the suite does not run beside them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

PARALLEL = 2


class Batch:
    """Named jobs (``job(batch)`` → anything), run on ``PARALLEL`` threads in the given
    order once the first result is asked for; ``Batch.run`` starts their processes."""

    def __init__(self, jobs: Dict[str, Callable[["Batch"], Any]], parallel: int = PARALLEL):
        self._jobs = dict(jobs)
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="background")
        self._lock = threading.Lock()
        self._futures: Dict[str, Future] = {}
        self._running: List[subprocess.Popen] = []
        self._closed = False

    def start(self) -> None:
        with self._lock:
            for name, job in self._jobs.items():
                if name not in self._futures:
                    self._futures[name] = self._pool.submit(job, self)

    @property
    def started(self) -> bool:
        return bool(self._futures)

    def result(self, name: str, timeout: Optional[float] = None) -> Any:
        """Job ``name``'s return value (its exception is raised here), once it is done."""
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
            running = list(self._running)
        for proc in running:
            _kill_group(proc)
        self._pool.shutdown(wait=True, cancel_futures=True)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
