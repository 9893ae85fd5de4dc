"""Smoke test for ``python -m bench.recovery --quick``: every variant yields every figure.

It asserts nothing about speed, recovery time or the targets; only that each
run worked (a worker was killed and training still reached its last step) and
that the JSON holds each variant's figures and the ratios.
"""

import pytest

from bench_runs import WAIT_TIMEOUT_S

RECOVERY = ("recovery_s", "steps_rerun", "commit_interval", "first_step_s", "wall_s",
            "peak_mem_mib")
THROUGHPUT = ("steady_samples_per_s", "first_step_s", "wall_s", "peak_mem_mib")
PREEMPT = ("notice_to_step_s", "steps_rerun", "first_step_s", "wall_s", "peak_mem_mib")
EXPECTED = {
    "raysgd_recovery": RECOVERY + ("recovery_reported_s", "steps_lost_reported"),
    "raysgd_recovery_nospare": RECOVERY + ("recovery_reported_s", "steps_lost_reported"),
    "raytrain_recovery": RECOVERY,
    "raysgd_preempt": PREEMPT,
    "raytrain_preempt": PREEMPT,
    "raysgd_commit_none": THROUGHPUT,
    "raysgd_commit_default": THROUGHPUT + ("commit_interval",),
}  # every variant but raysgd_commit_10 (another interval only: bench_runs.QUICK_RUNS)
CAN_BE_ZERO = {"steps_rerun", "steps_lost_reported"}


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_recovery_quick_reports_every_figure(bench_quick):
    # python -m bench.recovery --quick --out ... (bench_runs.QUICK_RUNS)
    run = bench_quick.result("recovery", WAIT_TIMEOUT_S)
    document, stdout = run.document(), run.stdout
    assert set(document["variants"]) == set(EXPECTED)
    for name, figures in EXPECTED.items():
        variant = document["variants"][name]
        assert variant["runs"], name
        for run in variant["runs"]:
            assert run["ok"], f"{name}: {run.get('error')}"
        for figure in figures:
            stats = variant["summary"][figure]
            assert stats, (name, figure)
            assert all(stats[k] >= 0 if figure in CAN_BE_ZERO else stats[k] > 0
                       for k in ("median", "min", "max")), (name, figure, stats)
    for name in ("raysgd_recovery", "raysgd_recovery_nospare", "raytrain_recovery"):
        run = document["variants"][name]["runs"][0]
        assert run["final_step"] == run["expected_final_step"], run
        # restarts: rank 0's pid changed. raysgd's rank 0 survives and keeps its process, with
        # or without a spare; Ray Train restarts every worker.
        assert run["restarts"] == 0 if name.startswith("raysgd") else run["restarts"] >= 1, run
    for name, spares in (("raysgd_recovery", None), ("raysgd_recovery_nospare", 0)):
        run = document["variants"][name]["runs"][0]
        assert run["spare_workers"] == spares and run["warm_spare_wait_s"] is None, run
        assert run["killed_at_step"] is not None and not run["kill_error"], run
        assert run["recoveries"] == 1 and run["num_workers_after"] == 2, run
    # A preemption notice: raysgd moves the ranks and re-runs nothing; Ray Train restarts.
    preempted = document["variants"]["raysgd_preempt"]["runs"][0]
    assert preempted["preemptions"] == 1 and preempted["failures"] == 0, preempted
    assert preempted["steps_rerun"] == 0 and preempted["steps_lost_reported"] == 0, preempted
    assert preempted["final_step"] == preempted["expected_final_step"], preempted
    restarted = document["variants"]["raytrain_preempt"]["runs"][0]
    assert restarted["restarts"] >= 1 and not restarted["kill_error"], restarted
    labels = {(ratio["ratio"], ratio["figure"]) for ratio in document["ratios"]}
    assert labels == {("raysgd/Ray Train", "recovery_s"), ("raysgd/Ray Train", "steps_rerun"),
                      ("raysgd spare/no spare", "recovery_s"),
                      ("raysgd no spare/Ray Train", "recovery_s"),
                      ("raysgd/Ray Train preempted", "notice_to_step_s"),
                      ("raysgd re-run/interval", "steps_rerun/commit_interval"),
                      ("Ray Train re-run/interval", "steps_rerun/commit_interval"),
                      ("commit default/none", "steady_samples_per_s")}
    assert "memory_method" in document["meta"]
    assert "raysgd/Ray Train" in stdout  # the ratios table was printed
