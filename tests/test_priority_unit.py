"""raysgd.worker.priority without Ray: the driver's choice of a rank's niceness, and the
setting of every thread of a process (in a child process: raising a niceness is one-way
without privilege)."""
import os
import subprocess
import sys
import textwrap

import pytest

from raysgd.errors import ConfigError
from raysgd.worker import priority


def test_ranks_take_the_drivers_niceness_by_default(monkeypatch):
    monkeypatch.delenv(priority.ENV, raising=False)
    assert priority.rank_niceness() == os.getpriority(os.PRIO_PROCESS, 0)


@pytest.mark.parametrize("value, expected", [("ray", None), (" RAY ", None), ("5", 5),
                                             ("-3", -3), ("", os.getpriority(os.PRIO_PROCESS, 0))])
def test_the_environment_overrides_it(monkeypatch, value, expected):
    monkeypatch.setenv(priority.ENV, value)
    assert priority.rank_niceness() == expected


@pytest.mark.parametrize("value", ["fast", "20", "-21", "1.5"])
def test_a_bad_value_says_what_to_use(monkeypatch, value):
    monkeypatch.setenv(priority.ENV, value)
    with pytest.raises(ConfigError, match="integer niceness from -20 to 19, or 'ray'"):
        priority.rank_niceness()


def test_every_thread_of_the_process_is_set_and_new_threads_inherit_it():
    code = textwrap.dedent("""
        import os, threading
        from raysgd.worker import priority
        stop = threading.Event()
        old = threading.Thread(target=stop.wait, daemon=True)
        old.start()
        target = min(19, priority.current() + 3)
        assert priority.set_niceness(target)
        seen = {}
        new = threading.Thread(
            target=lambda: seen.update(new=os.getpriority(os.PRIO_PROCESS, 0)))
        new.start(); new.join()
        print(target, os.getpriority(os.PRIO_PROCESS, os.getpid()),
              os.getpriority(os.PRIO_PROCESS, old.native_id), seen["new"])
        stop.set()
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    out = done.stdout.split()
    assert len(set(out)) == 1, f"target, main, older thread, newer thread: {out}"


def test_a_refused_raise_is_reported_not_raised(monkeypatch, caplog):
    def refuse(which, who, nice):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(priority.os, "setpriority", refuse)
    with caplog.at_level("INFO", logger="raysgd"):
        assert priority.set_niceness(-5) is False
    assert "needs root, CAP_SYS_NICE or RLIMIT_NICE" in caplog.text
