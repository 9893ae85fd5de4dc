"""The spare's low-priority warm-up thread (raysgd.worker.low_priority), without Ray."""
import os
import subprocess
import sys
import threading

import pytest

from raysgd.worker.low_priority import run_in_background, thread_priority, threads_left_low

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="thread priorities are per thread on Linux only")


def test_the_function_runs_in_the_idle_class_and_the_caller_keeps_its_priority():
    before = thread_priority(threading.get_native_id())
    seen = {}

    def work():
        seen["policy"] = thread_priority(threading.get_native_id())[0]
        return 42

    result, info = run_in_background(work)
    assert result == 42 and seen["policy"] == os.SCHED_IDLE
    assert info["priority"] == "idle" and info["policy"] == os.SCHED_IDLE
    assert thread_priority(threading.get_native_id()) == before
    assert info["threads_left_low"] == []


def test_an_exception_reaches_the_caller():
    def broken():
        raise KeyError("inside")

    with pytest.raises(KeyError, match="inside"):
        run_in_background(broken)


def test_a_thread_started_during_the_warm_up_does_not_stay_low():
    """Threads inherit their creator's priority: one a library starts while imported in the
    warm-up would keep the idle class. It is raised back where the process may (root here;
    CI runs as root too), and reported where it may not."""
    stop = threading.Event()
    started = {}

    def starts_a_pool():
        worker = threading.Thread(target=stop.wait, daemon=True)
        worker.start()
        started["thread"] = worker

    try:
        _, info = run_in_background(starts_a_pool)
        tid = started["thread"].native_id
        if os.geteuid() == 0:
            assert info["threads_left_low"] == []
            assert thread_priority(tid) == thread_priority(threading.get_native_id())
            assert tid not in threads_left_low()
        else:
            assert info["threads_left_low"] == [tid]
    finally:
        stop.set()


def test_loading_the_actor_class_imports_no_torch():
    """Ray loads raysgd.worker.actor to create every worker, spares included; torch must
    come only with the warm-up (or start()), or a spare would import it at normal priority."""
    code = ("import sys, raysgd.worker.actor; "
            "print(sorted(m for m in ('torch', 'raysgd.worker.runner', 'raysgd.trainer') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
