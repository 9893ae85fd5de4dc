"""The chaos benchmark's pure parts: the schedule, a run's figures, the cells' summaries."""
import pytest

from bench.chaos.analysis import run_figures
from bench.chaos.runners import TRAINER_LOG_WIDTH, raysgd_lines
from bench.chaos.schedule import KINDS, Event, from_args, make_schedule, to_args
from bench.chaos.summary import breakdown, cell_key, summarize_cells, targets


def test_a_seed_gives_one_schedule_and_the_text_form_round_trips():
    first = make_schedule(7, 20.0, 600.0)
    assert first == make_schedule(7, 20.0, 600.0) != make_schedule(8, 20.0, 600.0)
    assert from_args(to_args(first)) == first
    assert make_schedule(7, None, 600.0) == [] and from_args("") == []
    assert all(0 < e.at_s < 600 and e.kind in KINDS and e.rank in (0, 1) for e in first)
    assert [e.at_s for e in first] == sorted(e.at_s for e in first)


def test_arrivals_are_poisson_at_the_mean_rate_and_kinds_and_ranks_spread():
    events = [e for seed in range(40) for e in make_schedule(seed, 20.0, 1000.0)]
    per_window = len(events) / 40
    assert 45 <= per_window <= 55  # 50 expected; the sd over 40 windows is about 1.1
    for kind in KINDS:
        assert 0.28 <= sum(e.kind == kind for e in events) / len(events) <= 0.39
    assert 0.45 <= sum(e.rank for e in events) / len(events) <= 0.55


def test_bad_schedules_are_refused():
    with pytest.raises(ValueError, match="mtbf_s and window_s must be > 0"):
        make_schedule(1, 0.0, 10.0)
    with pytest.raises(ValueError, match="unknown event kind 'flood'"):
        from_args("1.0:flood:0")


def records(steps, start=100.0, dt=0.1, pid=1):
    return [(step, start + i * dt, pid) for i, step in enumerate(steps)]


def event(kind, time, notice=0.0, landed=True):
    return {"kind": kind, "time": time, "end": time + notice, "landed": landed}


def test_a_kill_costs_its_longest_pause_and_the_rolled_back_steps():
    # Steps 1..10 every 0.1 s; killed at 101.0 (after step 10 at 100.9, step 11 in flight
    # completes at 101.05); back at 104.0 from a checkpoint after step 6.
    log = records(range(1, 11)) + [(11, 101.05, 1)] + records(range(7, 15), start=104.0, pid=2)
    figures = run_figures(log, [event("kill", 101.0)], t0=99.0, window_s=5.75, global_batch=8)
    assert figures["progress_steps"] == 14 and figures["samples"] == 14 * 8
    assert figures["redone_steps"] == 5 and figures["redone_samples"] == 40  # 7..11 twice
    assert figures["first_step_s"] == pytest.approx(1.0) and figures["restarts"] == 1
    assert figures["steady_samples_per_s"] is None  # faulted runs have no steady rate
    (kill,) = figures["events"]
    assert kill["pause_s"] == pytest.approx(104.0 - 101.05) and kill["redone_steps"] == 5


def test_a_preemption_pause_counts_from_the_notice_and_steps_after_the_window_do_not_count():
    # Noticed at 100.5, the ranks move (a 2 s gap) without losing a step; the window ends at
    # 103.95, so the steps logged after it are left out.
    log = records(range(1, 6)) + records(range(6, 30), start=102.5)
    figures = run_figures(log, [event("preempt", 100.5, notice=15.0), event("kill", 103.0,
                                                                            landed=False)],
                          t0=100.0, window_s=3.95, global_batch=1)
    assert figures["progress_steps"] == 20 and figures["redone_steps"] == 0
    assert figures["events_missed"] == 1
    (preempt,) = figures["events"]
    assert preempt["pause_s"] == pytest.approx(2.0) and preempt["redone_steps"] == 0


def test_an_outage_still_going_at_the_window_end_counts_until_it():
    figures = run_figures(records(range(1, 4)), [event("node", 100.25)], t0=100.0,
                          window_s=5.0, global_batch=1)
    assert figures["events"][0]["pause_s"] == pytest.approx(5.0 - 0.25)


def test_an_unfaulted_run_reports_its_steady_rate_over_the_second_half():
    figures = run_figures(records(range(1, 101)), [], t0=100.0, window_s=10.0, global_batch=4)
    assert figures["steady_samples_per_s"] == pytest.approx(40.0)


def run(samples, window=10.0, steady=None, events=(), ok=True):
    return {"ok": ok, "samples": samples, "window_s": window, "steady_samples_per_s": steady,
            "global_batch": 4, "redone_samples": 0, "first_step_s": 1.0,
            "events": list(events), "events_missed": 0}


def test_goodput_divides_by_unfaulted_torchrun_and_the_targets_compare_medians():
    kill = {"kind": "kill", "pause_s": 2.0, "redone_steps": 5}
    cells = {cell_key("torchrun", None): [run(900, steady=100.0), run(900, steady=120.0)],
             cell_key("raysgd", None): [run(900, steady=110.0)],
             cell_key("raysgd", 20.0): [run(880, events=[kill]), run(0, ok=False)],
             cell_key("raytrain", 20.0): [run(440)]}
    summaries = summarize_cells(cells)
    assert summaries["raysgd@20s"]["goodput"]["median"] == pytest.approx(880 / 1100)
    assert summaries["raysgd@20s"]["ok_runs"] == 1 and summaries["raysgd@20s"]["runs"] == 2
    part = summaries["raysgd@20s"]["breakdown"]["kill"]
    assert part["events"] == 1 and part["lost_s_total"] == pytest.approx(2.0 + 5 * 4 / 110.0)
    rows = {row["target"]: row for row in targets(summaries, [20.0], {20.0: 0.80})}
    assert rows["raysgd goodput, MTBF 20s"]["met"] is True
    assert rows["raysgd/Ray Train goodput, MTBF 20s"]["value"] == pytest.approx(2.0)
    assert rows["unfaulted raysgd/torchrun samples/s"]["value"] == pytest.approx(1.0)
    # torchft has a bar (>= 1.0), torchrun none (this machine flatters it); a lost node's
    # median pause has one too (<= 3 s).
    node = {"kind": "node", "pause_s": 2.5, "redone_steps": 0}
    cells[cell_key("torchft", 20.0)] = [run(1000)]
    cells[cell_key("torchrun", 20.0)] = [run(800)]
    cells[cell_key("raysgd", 20.0)] = [run(880, events=[kill, node])]
    rows = {row["target"]: row for row in targets(summarize_cells(cells), [20.0], {20.0: 0.80})}
    assert rows["raysgd/torchft goodput, MTBF 20s"]["value"] == pytest.approx(0.88)
    assert rows["raysgd/torchft goodput, MTBF 20s"]["met"] is False
    assert rows["raysgd/torchrun goodput, MTBF 20s"]["value"] == pytest.approx(1.1)
    assert rows["raysgd/torchrun goodput, MTBF 20s"]["met"] is None
    assert rows["raysgd lost node -> next step (median pause), MTBF 20s"]["met"] is True


def test_a_breakdown_without_a_step_time_counts_pauses_only():
    runs = [run(1, events=[{"kind": "preempt", "pause_s": 1.5, "redone_steps": 3}])]
    assert breakdown(runs, None)["preempt"]["lost_s_total"] == pytest.approx(1.5)


def test_event_fields_are_what_the_injector_reads():
    assert Event(1.0, "kill", 0).kind == "kill"


def test_a_rollback_during_a_notice_is_charged_to_the_kill_before_it():
    # Killed at 100.95, noticed at 101.0 (node gone at 116), the rollback to step 6 is
    # logged at 103.0: the kill's, not the notice's.
    log = records(range(1, 11)) + records(range(7, 30), start=103.0, pid=2)
    figures = run_figures(log, [event("kill", 100.95), event("preempt", 101.0, notice=15.0)],
                          t0=100.0, window_s=5.25, global_batch=1)
    kill, preempt = figures["events"]
    assert kill["redone_steps"] == 4 and preempt["redone_steps"] == 0
    assert preempt["pause_s"] == pytest.approx(2.0)


def test_raysgds_recovery_parts_are_summarized_and_printed():
    from bench.chaos.summary import recovery_parts
    from bench.chaos.tables import recovery_parts_table

    reported = {"recovery_phases": [
        {"survivors_s": 0.1, "replace_s": 1.0, "restore_s": 0.2, "first_step_s": 0.3,
         "other_s": 0.0, "total_s": 1.6},
        {"restart_s": 3.0, "restore_s": 0.4, "first_step_s": 0.6, "other_s": 0.0,
         "total_s": 4.0}]}
    parts = recovery_parts([{"reported": reported}, {"reported": {}}])
    assert parts["recoveries"] == 2
    assert parts["replace_s"]["median"] == pytest.approx(0.5)  # 1.0 and 0 (not run)
    assert parts["total_s"]["max"] == 4.0
    assert recovery_parts([{"reported": {}}]) == {}
    table = recovery_parts_table({"raysgd@20s": {"recovery_parts": parts},
                                  "torchrun@20s": {"recovery_parts": {}}})
    assert "raysgd@20s" in table and "torchrun" not in table and "replace" in table


def test_torchft_groups_share_one_step_log_that_only_moves_forward(tmp_path):
    from bench.chaos.torchft_loop import SharedProgress
    from bench.recovery.steplog import read_log, read_pid

    first, second = SharedProgress(str(tmp_path), 0), SharedProgress(str(tmp_path), 1)
    for count in (2, 4):  # both groups see the same committed count after each step
        first.advance(count)
        second.advance(count)
    second.advance(5)  # alone after the other's death: one group's batch per step
    first.advance(3)  # a group healed behind the log writes nothing until it passes it
    assert [step for step, _, _ in read_log(str(tmp_path))] == [2, 4, 5]
    assert read_pid(str(tmp_path), 1) == read_pid(str(tmp_path), 0)  # one process here


def test_the_goodput_shortfall_splits_into_rate_start_events_and_the_rest():
    from bench.chaos.summary import shortfall, shortfall_parts
    from bench.chaos.tables import shortfall_table

    # torchrun 100 samples/s, this trainer 80 unfaulted; a 10 s window, first step at 1 s,
    # one 2 s pause and 20 samples redone: 80 * (10 - 1 - 2) - 20 = 540 distinct samples.
    faulted = {**run(540, events=[{"kind": "kill", "pause_s": 2.0, "redone_steps": 5}]),
               "redone_samples": 20}
    parts = shortfall(faulted, baseline=100.0, own_rate=80.0)
    assert parts["rate"] == pytest.approx(0.2)
    assert parts["start"] == pytest.approx(0.08)
    assert parts["events"] == pytest.approx(0.16 + 0.02)
    assert parts["rest"] == pytest.approx(0.0, abs=1e-12)
    assert sum(parts.values()) == pytest.approx(1 - 540 / 1000)
    # 40 samples fewer than that: the rest, e.g. a slow stretch after the recovery.
    assert shortfall({**faulted, "samples": 500}, 100.0, 80.0)["rest"] == pytest.approx(0.04)
    assert shortfall(faulted, None, 80.0) is None and shortfall(faulted, 100.0, None) is None
    assert shortfall({**faulted, "ok": False}, 100.0, 80.0) is None
    summary = shortfall_parts([faulted, {**faulted, "samples": 500}], 100.0, 80.0)
    assert summary["rest"]["median"] == pytest.approx(0.02)
    assert shortfall_parts([], 100.0, 80.0) == {}
    table = shortfall_table({"raysgd@20s": {"shortfall": summary}, "torchrun@none": {}})
    assert "raysgd@20s" in table and "torchrun" not in table and "rest" in table


def test_a_run_keeps_raysgds_warnings_from_its_driver_log_and_nothing_else():
    log = "\n".join(["2026-12-02 INFO worker.py: Connecting to existing Ray cluster",
                     "raysgd: rank(s) [1] could not be replaced with the other ranks staying "
                     "(TimeoutError()); restarting every worker",
                     "(raylet) a line of Ray's own",
                     "raysgd: recovering from worker failure (ranks [1]) " + "x" * 500])
    lines = raysgd_lines(log)
    assert [line[:22] for line in lines] == ["raysgd: rank(s) [1] co", "raysgd: recovering fro"]
    assert len(lines[1]) == TRAINER_LOG_WIDTH
    assert raysgd_lines("\n".join(["raysgd: again"] * 100), limit=3) == ["raysgd: again"] * 3
