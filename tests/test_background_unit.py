"""The suite's background runs (``background.Batch``): lanes, order, environment. No Ray."""
import os
import sys
import threading
import time

import pytest

from background import Batch


def _recorder(log, lock, running, peak, hold_s=0.05):
    def job(name):
        def run(_batch):
            with lock:
                log.append(name)
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(hold_s)
            with lock:
                running[0] -= 1
            return name
        return run
    return job


def test_a_narrow_start_runs_one_at_a_time_in_order_and_a_result_widens_it():
    log, lock, running, peak = [], threading.Lock(), [0], [0]
    job = _recorder(log, lock, running, peak)
    batch = Batch({name: job(name) for name in "abcd"}, parallel=2)
    batch.start(width=1)
    assert batch.result("a", timeout=10) == "a"  # asking widens to 2 lanes
    batch.wait_all()
    assert log == list("abcd")
    assert peak[0] == 2
    batch.close()


def test_a_result_asked_without_widening_keeps_one_lane():
    log, lock, running, peak = [], threading.Lock(), [0], [0]
    job = _recorder(log, lock, running, peak)
    batch = Batch({name: job(name) for name in "abcd"}, parallel=2)
    batch.start(width=1)
    assert batch.result("c", timeout=10, widen=False) == "c"
    batch.wait_all()
    assert log == list("abcd") and peak[0] == 1
    batch.close()


def test_width_one_never_overlaps_and_keeps_the_submission_order():
    log, lock, running, peak = [], threading.Lock(), [0], [0]
    job = _recorder(log, lock, running, peak, hold_s=0.02)
    batch = Batch({name: job(name) for name in "abcdef"}, parallel=3)
    batch.start(width=1)
    deadline = time.monotonic() + 10
    while len(log) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    batch.wait_all()
    assert log == list("abcdef") and peak[0] == 1
    batch.close()


def test_runs_get_the_batch_environment_not_the_one_changed_since(monkeypatch):
    monkeypatch.setenv("RAYSGD_BACKGROUND_PROBE", "at-start")
    env = dict(os.environ)
    code = "import os; print(os.environ.get('RAYSGD_BACKGROUND_PROBE'))"
    batch = Batch({"probe": lambda b: b.run([sys.executable, "-c", code], timeout=60)}, env=env)
    monkeypatch.setenv("RAYSGD_BACKGROUND_PROBE", "changed-by-a-test")
    assert batch.result("probe", timeout=60).stdout.strip() == "at-start"
    batch.close()


def test_a_closed_batch_starts_no_waiting_job():
    gate = threading.Event()
    batch = Batch({"first": lambda b: gate.wait(10), "second": lambda b: "ran"}, parallel=2)
    batch.start(width=1)
    time.sleep(0.1)
    closer = threading.Thread(target=batch.close)
    closer.start()
    gate.set()
    closer.join(10)
    with pytest.raises(RuntimeError, match="closed"):
        batch.result("second", timeout=10)
