"""Subprocess runs that tests wait for, run in the background of the session.

Some tests only start a script (an example, a benchmark's quick mode) and check
its output. Each such script starts a Ray and processes of its own, one after the
other. The in-process tests leave about a fifth of this 2-core machine idle (Tune's
polling, process start-up, waits for a kill to land), so the session's one
:class:`Batch` (``conftest.background``) starts these runs with the first test, one at
a time and at a lower CPU priority (``NICE``) beside the in-process tests, which
keep the CPU whenever they want it. The tests that wait for a run are ordered after
all others (``conftest.pytest_collection_modifyitems``); the first of them to wait
lets the batch run ``PARALLEL`` at a time, which fills both cores once nothing else
runs. Each test asserts on its run what it asserted when it ran the script itself.
Every run gets ``RAY_ADDRESS=local``: a ``ray.init()`` in it starts a Ray of its own,
never joining the ``ray.cluster_utils.Cluster`` that a multi-node test beside it
records in ``/tmp/ray/ray_current_cluster``.
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional

PARALLEL = 2  # runs at once once a test waits
BESIDE = 1  # runs at once while the in-process tests still run
# The nice value of each run's processes, and of its autogroup: with autogroups (the
# Linux default) a run in a session of its own would otherwise get as much CPU as the
# whole pytest session. At 10, one run gets about a tenth of a busy core.
NICE = 10


class Batch:
    """Named jobs (``job(batch)`` → anything), started in the given order on
    :meth:`start`: ``beside`` at a time until the first :meth:`result` is asked for,
    ``parallel`` at a time from then on; ``Batch.run`` starts their processes."""

    def __init__(self, jobs: Dict[str, Callable[["Batch"], Any]], parallel: int = PARALLEL,
                 beside: int = BESIDE, nice: int = NICE):
        self._jobs = dict(jobs)
        self._pool = ThreadPoolExecutor(parallel, thread_name_prefix="background")
        self._slots = threading.Semaphore(min(beside, parallel))
        self._more_slots = parallel - min(beside, parallel)
        self._nice = nice
        self._lock = threading.Lock()
        self._futures: Dict[str, Future] = {}
        self._running: List[subprocess.Popen] = []
        self._closed = False

    def start(self) -> None:
        with self._lock:
            for name, job in self._jobs.items():
                if name not in self._futures:
                    self._futures[name] = self._pool.submit(self._in_a_slot, job)

    def _in_a_slot(self, job: Callable[["Batch"], Any]) -> Any:
        with self._slots:
            return job(self)

    def widen(self) -> None:
        """From now on ``parallel`` jobs at a time (once; later calls do nothing)."""
        with self._lock:
            more, self._more_slots = self._more_slots, 0
        for _ in range(more):
            self._slots.release()

    @property
    def started(self) -> bool:
        return bool(self._futures)

    def result(self, name: str, timeout: Optional[float] = None) -> Any:
        """Job ``name``'s return value (its exception is raised here), once it is done.
        A test that waits has nothing beside it any more: the batch widens."""
        self.start()
        self.widen()
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
        **kwargs)`` for a job, at the batch's nice value with ``RAY_ADDRESS=local`` added to
        its environment, in a session (and so a process group and an autogroup) of its own:
        at the timeout (raised as ``subprocess.TimeoutExpired``, as ``subprocess.run`` does)
        or when the batch is closed, the whole group is killed, the script's Ray with it."""
        env = dict(kwargs.pop("env", None) or os.environ, RAY_ADDRESS="local")
        with self._lock:
            if self._closed:
                raise RuntimeError("the batch was closed before this run started")
            proc = subprocess.Popen(_niced(command, self._nice), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True,
                                    env=env, **kwargs)
            _renice_autogroup(proc.pid, self._nice)
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


def _niced(command: List[str], nice: int) -> List[str]:
    """``command`` run by ``nice -n NICE`` (so every process it starts inherits it)."""
    return ["nice", "-n", str(nice), *command] if nice else list(command)


def _renice_autogroup(pid: int, nice: int) -> None:
    """Give ``pid``'s autogroup (its session's, as ``start_new_session`` made it) the nice
    value; without autogroups (no such file) the processes' own nice value is what counts."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as handle:
            handle.write(str(nice))
    except OSError:
        pass
