"""The recovery benchmarks' step log: finding the first step after a restore. No Ray."""
import subprocess

from bench.recovery.steplog import Killer, StepLog, analyse, read_log, read_setups


def test_a_resume_from_the_survivors_state_is_found_by_its_set_up_line():
    # rank 0 keeps its pid and its step count goes on: only the set-up line marks the restore
    records = [(step, float(step), 7) for step in range(1, 6)] + [(6, 9.0, 7), (7, 10.0, 7)]
    found = analyse(records, kill_time=5.5, setups=[0.5, 8.0])
    assert found["resumed_from_step"] == 5 and found["steps_rerun"] == 0
    assert found["recovery_s"] == 9.0 - 5.5


def test_a_step_finished_in_flight_after_the_kill_counts_as_reached():
    records = [(1, 1.0, 7), (2, 2.0, 7), (3, 3.5, 7), (3, 9.0, 7), (4, 10.0, 7)]
    found = analyse(records, kill_time=3.0, setups=[0.5, 8.0])
    assert found["last_step_before_restore"] == 3 and found["resumed_from_step"] == 2
    assert found["steps_rerun"] == 1


def test_without_set_up_lines_a_new_pid_or_a_step_going_back_marks_the_restore():
    records = [(1, 1.0, 7), (2, 2.0, 7), (3, 3.0, 7), (2, 9.0, 8), (3, 10.0, 8)]
    found = analyse(records, kill_time=3.5)
    assert found["resumed_from_step"] == 1 and found["steps_rerun"] == 2


def test_set_up_lines_do_not_read_as_steps(tmp_path):
    log = StepLog(str(tmp_path), 0)
    log.completed(1)
    StepLog(str(tmp_path), 0).completed(2)
    assert [step for step, _, _ in read_log(str(tmp_path))] == [1, 2]
    assert len(read_setups(str(tmp_path))) == 2


def test_a_step_floor_slows_only_the_steps_after_floor_after(tmp_path):
    log = StepLog(str(tmp_path), 0, min_step_s=0.05, floor_after=2)
    for step in range(1, 6):
        log.completed(step)
    walls = [wall for _, wall, _ in read_log(str(tmp_path))]
    gaps = [b - a for a, b in zip(walls, walls[1:])]
    assert gaps[0] < 0.04  # step 2: no floor
    assert all(gap >= 0.045 for gap in gaps[1:])  # steps 3-5 (time.sleep never wakes early)


class _Drained:
    """What notice_figures reads of a Drainer."""

    def __init__(self, notice_time, removed_time, error=None):
        self.notice_time, self.removed_time, self.error = notice_time, removed_time, error
        self.step_at_notice = 3


def test_a_preemption_run_that_ended_before_the_node_went_says_so():
    from bench.recovery.drain import notice_figures

    plan = {"notice_step": 3, "expected_final_step": 5, "deadline_s": 10}
    same_process = [(step, float(step), 7) for step in range(1, 6)]
    ended = notice_figures(_Drained(3.5, 15.0), same_process, 0.0, plan)
    assert ended["notice_to_step_s"] is None
    assert "training ended before the node was removed" in ended["kill_error"]
    moved = same_process[:3] + [(4, 12.0, 8), (5, 13.0, 8)]
    figures = notice_figures(_Drained(3.5, 11.0), moved, 0.0, plan)
    assert figures["kill_error"] is None and figures["notice_to_step_s"] == 12.0 - 3.5
    assert figures["steps_rerun"] == 0


def test_a_kill_that_would_come_after_the_last_step_is_an_error_not_a_kill(tmp_path):
    # Ray Train registered its checkpoint only after training ended (a loaded machine): a
    # kill then measures no recovery, and must say so rather than leave figures empty.
    log = StepLog(str(tmp_path), 0)
    for step in range(1, 9):
        log.completed(step)
    victim = subprocess.Popen(["sleep", "30"])
    try:
        killer = Killer(str(tmp_path), 6, lambda: victim.pid, final_step=8, deadline_s=5)
        killer.run()
        assert victim.poll() is None and killer.kill_time is None
    finally:
        victim.kill()
        victim.wait()
    assert "last step (8) before the kill" in killer.error
