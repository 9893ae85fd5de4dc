"""RecoveryClock: where a recovery's seconds went, on a fake clock (no Ray)."""
from raysgd.driver.recovery_stats import RecoveryClock


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_parts_add_up_to_the_total_and_repeat_parts_add():
    clock = FakeClock()
    timer = RecoveryClock(clock)
    timer.start()
    clock.now += 0.5  # the driver's own decisions before the first part
    with timer.phase("survivors"):
        clock.now += 0.25
    with timer.phase("replace"):
        clock.now += 1.0
    with timer.phase("restore"):
        clock.now += 0.5
    with timer.phase("replace"):  # a second attempt adds to the first
        clock.now += 1.0
    parts = timer.finish(first_step_wall=clock.now + 2.0)
    assert parts == {"survivors_s": 0.25, "replace_s": 2.0, "restore_s": 0.5,
                     "first_step_s": 2.0, "other_s": 0.5, "total_s": 5.25}
    assert sum(v for k, v in parts.items() if k != "total_s") == parts["total_s"]
    assert not timer.running and timer.finish(None) is None


def test_outside_a_recovery_nothing_is_timed():
    clock = FakeClock()
    timer = RecoveryClock(clock)
    with timer.phase("restore"):  # a rollback after a user error: no recovery
        clock.now += 3.0
    assert timer.finish(None) is None
    timer.start()
    clock.now += 1.0
    timer.start()  # a second failure inside the recovery counts from the first
    assert timer.finish(None)["total_s"] == 1.0


def test_a_first_step_stamped_before_the_last_part_ended_counts_as_zero():
    clock = FakeClock()
    timer = RecoveryClock(clock)
    timer.start()
    with timer.phase("restart"):
        clock.now += 2.0
    parts = timer.finish(first_step_wall=clock.now - 0.1)  # another node's clock, a bit behind
    assert parts["first_step_s"] == 0.0 and parts["total_s"] == 2.0


def test_a_failure_counts_from_when_its_dead_ranks_last_answered():
    clock = FakeClock()
    timer = RecoveryClock(clock)
    timer.start(since=clock.now - 1.5)  # the dead rank's last answer, 1.5 s before the notice
    with timer.phase("replace"):
        clock.now += 0.25
    parts = timer.finish(first_step_wall=clock.now + 0.25)
    assert parts == {"detect_s": 1.5, "replace_s": 0.25, "first_step_s": 0.25,
                     "other_s": 0.0, "total_s": 2.0}
    timer.start(since=clock.now + 5.0)  # a clock ahead of the driver's: no detection part
    assert "detect_s" not in timer.finish(None)


def test_the_health_monitor_says_when_ranks_last_answered():
    from raysgd.driver.health import HealthMonitor

    clock = FakeClock()
    monitor = HealthMonitor(2, timeout_s=10.0, clock=clock)
    clock.now += 1.0
    monitor.observe(0, {"idle_s": 0.0})
    monitor.observe(1, {"idle_s": 0.0})
    clock.now += 2.0
    monitor.observe(0, {"idle_s": 0.0})
    import time
    seen = monitor.last_seen([1])
    assert abs((time.time() - seen) - 2.0) < 0.5  # wall time, 2 s before now
    assert monitor.last_seen([]) is None
