"""The test session's batch of script runs (``background.Batch``): order, width, isolation."""
import sys
import threading
import time

import pytest

from background import Batch, Named


def recording_jobs(names, log, release):
    """Jobs that note when they start and end, and wait for ``release[name]``."""
    def job(name):
        def run(batch):
            log.append(("start", name))
            assert release[name].wait(30)
            log.append(("end", name))
            return name.upper()
        return run
    return {name: job(name) for name in names}


def wait_until(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_beside_tests_one_run_at_a_time_in_order_then_parallel_once_a_test_waits():
    names = ["a", "b", "c", "d"]
    log, release = [], {name: threading.Event() for name in names}
    batch = Batch(recording_jobs(names, log, release), parallel=2, beside_tests=1)
    try:
        batch.start()
        wait_until(lambda: ("start", "a") in log)
        time.sleep(0.2)
        assert log == [("start", "a")]  # b waits for a: one at a time beside the tests
        release["a"].set()
        wait_until(lambda: ("start", "b") in log)
        assert log == [("start", "a"), ("end", "a"), ("start", "b")]
        release["d"].set()
        waiter = threading.Thread(target=lambda: log.append(("result", batch.result("d", 30))))
        waiter.start()  # a test waits: the batch widens, c starts beside b
        wait_until(lambda: ("start", "c") in log)
        assert ("start", "d") not in log  # d keeps its turn after c
        release["c"].set()
        waiter.join(30)
        assert ("result", "D") in log and log.index(("start", "c")) < log.index(("start", "d"))
        release["b"].set()
        assert Named(batch, "").result("b", 30) == "B"
    finally:
        for event in release.values():
            event.set()
        batch.close()


def test_a_job_error_is_raised_to_the_test_that_waits_for_it():
    def broken(batch):
        raise ValueError("script went wrong")

    batch = Batch({"broken": broken, "fine": lambda b: 1})
    try:
        with pytest.raises(ValueError, match="script went wrong"):
            batch.result("broken", 30)
        assert batch.result("fine", 30) == 1
    finally:
        batch.close()


def test_runs_get_a_ray_of_their_own_and_close_kills_what_still_runs(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")  # as if a cluster were around
    show = "import os; print(os.environ['RAY_ADDRESS'])"
    batch = Batch({
        "env": lambda b: b.run([sys.executable, "-c", show], timeout=30).stdout.strip(),
        "sleeper": lambda b: b.run([sys.executable, "-c", "import time; time.sleep(60)"],
                                   timeout=120),
    }, parallel=2, beside_tests=2)
    batch.start()
    assert batch.result("env", 30) == "local"  # ray.init() there starts a new local Ray
    started = time.monotonic()
    wait_until(lambda: batch._running)
    batch.close()
    assert time.monotonic() - started < 30
    assert batch.result("sleeper", 30).returncode == -9  # SIGKILLed with its process group
