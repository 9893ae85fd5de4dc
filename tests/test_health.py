from raysgd.driver.health import HealthMonitor, WorkerHangError


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def report(steps, idle_s=0.0, where="x.py:1 in f"):
    return {"steps": steps, "idle_s": idle_s, "where": where}


def test_idle_rank_is_reported_with_its_location():
    clock = Clock()
    monitor = HealthMonitor(2, timeout_s=5, clock=clock)
    monitor.observe(0, report(3, idle_s=1))
    monitor.observe(1, report(3, idle_s=6, where="ops.py:9 in train_batch"))
    error = monitor.hang_error()
    assert isinstance(error, WorkerHangError) and error.ranks == (1,)
    assert "ops.py:9 in train_batch" in str(error)


def test_unanswered_health_check_counts_as_hung():
    clock = Clock()
    monitor = HealthMonitor(2, timeout_s=5, clock=clock)
    monitor.asked(0)
    monitor.asked(1)
    clock.now = 3
    monitor.observe(1, report(1))
    assert monitor.hang_error() is None
    clock.now = 6
    assert monitor.hang_error().ranks == (0,)


def test_late_answers_name_their_ranks_for_a_node_check():
    clock = Clock()
    monitor = HealthMonitor(3, timeout_s=5, clock=clock)
    monitor.asked(0)
    monitor.asked(1)
    clock.now = 0.4
    monitor.asked(2)
    monitor.observe(0, report(1))
    clock.now = 0.7
    assert monitor.late(0.5) == [1]  # 2 was asked 0.3 s ago; 0 answered
    clock.now = 1.0
    assert monitor.late(0.5) == [1, 2]


def test_every_rank_stuck_with_the_hung_one_is_named_with_where_it_is():
    """Rank 1 hangs in user code; rank 0 waits for it in its next all-reduce. Which of the
    two crosses the timeout first is a race; the error names both."""
    monitor = HealthMonitor(3, timeout_s=4, clock=Clock())
    monitor.observe(0, report(5, idle_s=4.1, where="graph.py:979 in _engine_run_backward"))
    monitor.observe(1, report(5, idle_s=3.9, where="ops.py:289 in train_batch"))
    monitor.observe(2, report(6, idle_s=0.5))
    error = monitor.hang_error()
    assert error.ranks == (0, 1)
    assert "in _engine_run_backward" in str(error) and "ops.py:289 in train_batch" in str(error)
    monitor.observe(0, report(6, idle_s=1.9))
    monitor.observe(1, report(6, idle_s=1.8))
    assert monitor.hang_error() is None  # half the timeout alone is no hang
