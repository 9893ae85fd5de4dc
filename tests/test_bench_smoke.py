"""Smoke test for ``python -m bench``: every variant yields every figure (speed is not checked)."""
import pytest

from bench_runs import WAIT_TIMEOUT_S

# Every variant but raysgd_2w_nospare (raysgd_2w with spare_workers=0: bench_runs.QUICK_RUNS).
VARIANTS = {"raysgd_2w", "raysgd_2w_plain_init", "torchrun_2w", "raytrain_2w", "plain_1t",
            "plain_2t", "raysgd_1w"}
FIGURES = ("first_step_s", "steady_samples_per_s", "wall_s", "peak_mem_mib")


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_quick_reports_every_figure_for_every_variant(bench_quick):
    # python -m bench --workload mlp --quick --out ... (bench_runs.QUICK_RUNS)
    proc = bench_quick.result("main", WAIT_TIMEOUT_S)
    document = proc.document()
    assert set(document["variants"]) == VARIANTS
    for name, variant in document["variants"].items():
        for run in variant["runs"]:
            assert run["ok"], f"{name}: {run.get('error')}"
        for figure in FIGURES:
            stats = variant["summary"][figure]
            assert stats and all(stats[k] > 0 for k in ("median", "min", "max")), (name, figure)
    assert {ratio["ratio"] for ratio in document["ratios"]} == {
        "raysgd/torchrun", "raysgd/Ray Train", "raysgd(1 worker)/plain", "raysgd plain-init/lean"}
    assert "memory_method" in document["meta"]
    assert "raysgd/torchrun" in proc.stdout  # the ratios table was printed
    # raysgd's variants time each steady epoch (quick mode: one), and the table shows them.
    assert [len(run["epoch_s"]) for run in document["variants"]["raysgd_2w"]["runs"]] == [1]
    assert "epoch (s, median)" in proc.stdout


def test_variants_start_a_ray_of_their_own_even_beside_a_cluster(monkeypatch):
    """Without ``RAY_ADDRESS=local`` a variant's ``ray.init(num_cpus=...)`` would join the
    cluster a test beside it (or a ``ray start``) left in ``/tmp/ray/ray_current_cluster``,
    and Ray refuses ``num_cpus`` there."""
    from bench.launch import child_env

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    env = child_env(2)
    assert env["RAY_ADDRESS"] == "local" and env["OMP_NUM_THREADS"] == "2"
