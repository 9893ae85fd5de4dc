"""Smoke test for ``python -m bench.warm --quick``: every variant yields every figure.

Nothing about speed is asserted (the targets are printed, not enforced). What
is asserted is what the figures say about processes, which does not depend on
the machine: the second trainer runs on the first one's worker processes with
the warm pool and on new ones with ``reuse_workers=False``; raysgd's Tune
trials (``reuse_actors=True``) share one trainable and its two workers, Ray
Train's start two workers per trial; a killed worker is recovered by a spare
that was waited for until warm. The benchmark's two other kill runs are the
recovery benchmark's, checked by its smoke test (``tests/bench_runs.py``).
"""

import pytest

from bench_runs import WAIT_TIMEOUT_S

SECOND = ("first_trainer_s", "second_trainer_s", "same_pids", "reused_workers", "shutdown_s",
          "launch_first_step_s", "wall_s", "peak_mem_mib")
TUNE = ("total_s", "per_trial_s", "trials_done", "distinct_worker_pids",
        "distinct_trainable_pids", "wall_s", "peak_mem_mib")
RECOVERY = ("recovery_s", "recovery_reported_s", "steps_rerun", "steps_lost_reported",
            "commit_interval", "first_step_s", "wall_s", "peak_mem_mib")
EXPECTED = {"second_reuse": SECOND, "second_noreuse": SECOND, "tune_raysgd": TUNE,
            "tune_raytrain": TUNE, "raysgd_recovery_warm": RECOVERY}
CAN_BE_ZERO = {"same_pids", "reused_workers", "steps_rerun", "steps_lost_reported"}


def _only_run(document, name):
    runs = document["variants"][name]["runs"]
    assert len(runs) == 1, (name, runs)
    return runs[0]


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_warm_quick_reports_every_figure(bench_quick):
    # python -m bench.warm --quick --out ... (bench_runs.QUICK_RUNS)
    run = bench_quick.result("warm", WAIT_TIMEOUT_S)
    document, stdout = run.document(), run.stdout
    assert set(document["variants"]) == set(EXPECTED)
    for name, figures in EXPECTED.items():
        variant = document["variants"][name]
        assert all(run["ok"] for run in variant["runs"]), (name, variant["runs"])
        for figure in figures:
            stats = variant["summary"][figure]
            assert stats, (name, figure)
            assert all(stats[k] >= 0 if figure in CAN_BE_ZERO else stats[k] > 0
                       for k in ("median", "min", "max")), (name, figure, stats)

    reuse, fresh = _only_run(document, "second_reuse"), _only_run(document, "second_noreuse")
    assert reuse["reuse_workers"] and sorted(reuse["pids_2"]) == sorted(reuse["pids_1"])
    assert reuse["same_pids"] == 1 and reuse["reused_workers"] == 2
    assert not fresh["reuse_workers"] and not set(fresh["pids_1"]) & set(fresh["pids_2"])
    assert fresh["same_pids"] == 0 and fresh["reused_workers"] == 0

    trials = document["meta"]["tune_trials"]
    assert trials >= 2
    raysgd_tune, raytrain_tune = (_only_run(document, "tune_raysgd"),
                                  _only_run(document, "tune_raytrain"))
    for run in (raysgd_tune, raytrain_tune):
        assert run["trials"] == run["trials_done"] == trials and not run["trial_errors"], run
        assert run["per_trial_s"] == pytest.approx(run["total_s"] / trials)
    assert raysgd_tune["reuse_actors"] is True
    assert raysgd_tune["distinct_trainable_pids"] == 1 and raysgd_tune["distinct_worker_pids"] == 2
    assert raytrain_tune["distinct_worker_pids"] == 2 * trials  # new workers every trial

    warm = _only_run(document, "raysgd_recovery_warm")
    # It waited for the spare (which, beside another benchmark of the smoke batch, may not
    # have warmed within the wait: the run says so, and recovery must work either way).
    assert warm["warm_spare_wait_s"] > 0 and isinstance(warm["spare_warm_at_kill"], bool), warm
    assert warm["killed_at_step"] is not None and not warm["kill_error"], warm
    assert warm["final_step"] == warm["expected_final_step"], warm
    assert warm["recoveries"] == 1 and warm["num_workers_after"] == 2, warm
    assert warm["restarts"] == 0, warm  # the spare took rank 1; rank 0 kept its process

    labels = {(ratio["ratio"], ratio["figure"]) for ratio in document["ratios"]}
    assert labels == {("2nd trainer reuse/no reuse", "second_trainer_s"),
                      ("2nd/1st trainer (reuse)", "second_trainer_s/first_trainer_s"),
                      ("Tune raysgd/Ray Train", "total_s")}  # those whose variants both ran
    targets = {(t["variant"], t["figure"]): t for t in document["meta"]["targets"]}
    assert set(targets) == {("second_reuse", "second_trainer_s"),
                            ("raysgd_recovery_warm", "recovery_s")}
    for target in targets.values():
        assert target["bound"] == "<= 1.0" and target["value"] > 0
        assert target["met"] == (target["value"] <= 1.0)
    assert "memory_method" in document["meta"]
    for text in ("target (median)", "Tune raysgd/Ray Train", "#2 <= 1.0 s"):
        assert text in stdout, text  # the tables were printed
