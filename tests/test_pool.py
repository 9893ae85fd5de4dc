"""Unit tests of the warm pool's bookkeeping, WarmSettings and the process baseline (no Ray)."""
import gc
import os
import random
import sys
import weakref

import numpy as np
import pytest
import torch

from raysgd.config import WarmSettings
from raysgd.driver.pool import Crew, WorkerPool
from raysgd.errors import ConfigError
from raysgd.function import session as func_session
from raysgd.worker import precision
from raysgd.worker.process_state import Baseline


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def make_pool(timeout_s=60.0):
    clock = Clock()
    return WorkerPool(clock=clock, timeout_s=lambda: timeout_s, schedule=False), clock


def crew(key="k", session="s1", actors=("a0", "a1"), spares=("spare",), held=None, stopped=None):
    return Crew(session, key, list(actors), list(spares), group=None, held=dict(held or {}),
                stop=(lambda c: stopped.append(c)) if stopped is not None else (lambda c: None))


def test_take_returns_the_crew_of_the_same_key_and_session_once():
    pool, _ = make_pool()
    given = crew()
    pool.give(given)
    assert pool.take("s1", "other key") is None
    assert pool.take("s1", "k") is given
    assert pool.take("s1", "k") is None


def test_a_crew_of_an_ended_session_is_forgotten_without_being_stopped():
    pool, _ = make_pool()
    stopped = []
    pool.give(crew(session="old", stopped=stopped))
    assert pool.idle_workers("old") == 3
    assert pool.take("new", "k") is None
    assert pool.idle_workers("old") == 0
    assert stopped == []  # its actors ended with their Ray session


def test_reap_stops_only_the_crews_idle_past_the_timeout():
    pool, clock = make_pool(timeout_s=60.0)
    stopped = []
    first = crew(key="a", stopped=stopped)
    pool.give(first)
    clock.now += 50
    pool.give(crew(key="b", stopped=stopped))
    clock.now += 11
    assert pool.reap() == 3
    assert stopped == [first]
    assert pool.idle_workers("s1") == 3


def test_release_idle_stops_everything_and_held_sums_reservations():
    pool, _ = make_pool()
    stopped = []
    pool.give(crew(key="a", held={"CPU": 2.0}, stopped=stopped))
    pool.give(crew(key="b", held={"CPU": 1.0, "GPU": 1.0}, stopped=stopped))
    assert pool.held("s1") == {"CPU": 3.0, "GPU": 1.0}
    assert pool.release_idle() == 6
    assert len(stopped) == 2 and pool.held("s1") == {}


def test_take_all_and_release_idle_pick_crews_by_predicate_within_the_session():
    pool, _ = make_pool()
    stopped = []
    cpu_a, cpu_b = crew(key="cpu"), crew(key="cpu", actors=("a2",), spares=())
    pool.give(cpu_a)
    pool.give(crew(key="gpu", held={"GPU": 1.0}, stopped=stopped))
    pool.give(cpu_b)
    assert pool.take_all("s1", lambda c: c.key == "cpu") == [cpu_a, cpu_b]
    assert pool.take_all("s1", lambda c: c.key == "cpu") == []
    pool.give(crew(key="cpu", stopped=stopped))
    assert pool.release_idle(lambda c: bool(c.held)) == 3  # only the one holding a GPU
    assert [c.key for c in stopped] == ["gpu"] and pool.idle_workers("s1") == 3
    pool.give(crew(key="gpu", held={"GPU": 1.0}, stopped=stopped))
    assert pool.release_held() == 3  # the same choice, by name; the CPU crews stay
    assert [c.key for c in stopped] == ["gpu", "gpu"] and pool.idle_workers("s1") == 3


def test_code_fits_unless_the_module_was_imported_from_another_version():
    from raysgd.driver.pool import code_fits

    stamp = ("ops", "/x/ops.py", 5)
    assert code_fits({}, stamp)
    assert code_fits({"other": ("other", "/x/other.py", 1)}, stamp)
    assert code_fits({"ops": stamp}, stamp)
    assert not code_fits({"ops": ("ops", "/x/ops.py", 4)}, stamp)  # edited since


def test_seat_fills_each_node_from_the_idle_processes_there_and_leaves_the_rest():
    from raysgd.driver.pool import seat

    idle = [("p1", "n1"), ("p2", "n2"), ("p3", "n1"), ("p4", "n3")]
    assert seat(["n1", "n1", "n1", "n2"], idle) == (["p1", "p3", None, "p2"], ["p4"])
    assert seat([], idle) == ([], ["p1", "p2", "p3", "p4"])
    assert seat(["n9"], idle) == ([None], ["p1", "p2", "p3", "p4"])
    assert seat(["n1"], []) == ([None], [])


def test_a_zero_timeout_stops_a_crew_at_once():
    pool, _ = make_pool(timeout_s=0)
    stopped = []
    pool.give(crew(stopped=stopped))
    assert len(stopped) == 1 and pool.idle_workers("s1") == 0


def test_a_crew_that_fails_to_stop_does_not_break_the_pool(caplog):
    pool, _ = make_pool()

    def explode(_):
        raise RuntimeError("actor handle gone")

    pool.give(Crew("s1", "k", ["a"], [], None, stop=explode))
    assert pool.release_idle() == 1
    assert "could not stop" in caplog.text


def test_warm_settings_defaults_and_validation():
    # None: the default, one spare where a node has a CPU the group did not reserve
    # (raysgd.driver.spare_plan decides per node), on GPUs too: a spare holds no GPU.
    assert WarmSettings.create(True, None, 2) == WarmSettings(True, None)
    assert WarmSettings.create(True, None, 2).spares is None
    assert WarmSettings.create(False, None, 0) == WarmSettings(False, 0)
    assert WarmSettings.create(True, 3, 2).spares == 3
    # Inside a Tune trial (or any placement group reserved for this process): none unless asked.
    assert WarmSettings.create(True, None, 2, in_trial=True).spares == 0
    assert WarmSettings.create(True, 1, 2, in_trial=True).spares == 1
    for bad in (-1, 1.5, True, "1"):
        with pytest.raises(ConfigError, match="spare_workers must be"):
            WarmSettings.create(True, bad, 2)
    with pytest.raises(ConfigError, match="reuse_workers must be True or False"):
        WarmSettings.create("yes", None, 2)
    with pytest.raises(ConfigError, match="spare_workers=0"):
        WarmSettings.create(True, 1, 0)


def test_baseline_restores_environment_cwd_rngs_and_raysgd_state(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAYSGD_BASELINE_KEPT", "before")
    threads = torch.get_num_threads()
    baseline = Baseline.capture()
    torch.manual_seed(1234)
    np.random.seed(0)
    random.seed(0)
    seeded = (np.random.rand(), random.random())
    np.random.seed(0)
    random.seed(0)
    os.environ["RAYSGD_BASELINE_ADDED"] = "1"
    os.environ["RAYSGD_BASELINE_KEPT"] = "changed"
    (tmp_path / "sub").mkdir()
    os.chdir(tmp_path / "sub")
    func_session._active = object()
    precision._warned_cpu_fp16 = True
    sys.path.append("/raysgd-test-added")
    torch.set_default_dtype(torch.float64)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(threads + 1)  # a trainer that gave its workers more CPUs

    class Module:  # an old runner's model that its hooks refer back to: only a collection frees it
        pass

    cycle = Module()
    cycle.self, cycle.weights = cycle, torch.zeros(1024)
    freed = weakref.ref(cycle)
    del cycle
    gc.disable()  # only restore() may collect it
    try:
        baseline.restore()
    finally:
        gc.enable()
    assert freed() is None  # before the next trainer allocates its own

    assert "RAYSGD_BASELINE_ADDED" not in os.environ
    assert os.environ["RAYSGD_BASELINE_KEPT"] == "before"
    assert os.getcwd() == str(tmp_path)
    assert torch.initial_seed() != 1234  # reseeded from entropy, as a new process is
    assert (np.random.rand(), random.random()) != seeded  # reseeded from entropy
    assert func_session.current_session() is None
    assert precision._warned_cpu_fp16 is False
    assert "/raysgd-test-added" not in sys.path
    assert torch.get_default_dtype() == torch.float32
    assert not torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == threads


@pytest.mark.parametrize("value", ["-1", "inf", "nan", "soon"])
def test_a_bad_idle_timeout_is_refused_with_the_fix(monkeypatch, value):
    from raysgd.driver.pool import idle_timeout_s

    monkeypatch.setenv("RAYSGD_IDLE_WORKER_TIMEOUT_S", value)
    with pytest.raises(ConfigError, match="RAYSGD_IDLE_WORKER_TIMEOUT_S"):
        idle_timeout_s()


def test_the_code_stamp_changes_when_the_operator_module_is_edited(tmp_path, monkeypatch):
    from raysgd.driver.warm import code_stamp

    (tmp_path / "edited_operator_module.py").write_text("class Op:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import edited_operator_module

    before = code_stamp(edited_operator_module.Op)
    assert before == code_stamp(edited_operator_module.Op)
    path = tmp_path / "edited_operator_module.py"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert code_stamp(edited_operator_module.Op) != before
    assert code_stamp(Clock) == code_stamp(Clock)  # a test module's class: stable
