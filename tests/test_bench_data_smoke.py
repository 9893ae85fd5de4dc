"""Smoke test for ``python -m bench.data --quick``: every variant trains and reports figures.

Nothing about speed is asserted (the target is printed, not enforced). What is
asserted is that each variant ran, trained every epoch over the whole data set
(``samples_per_epoch``), reported positive figures, and that the ratios and the
target were printed and saved.
"""

import pytest

from bench_runs import WAIT_TIMEOUT_S

# Every variant but raysgd_raydata_nospare (spare_workers=0 only: bench_runs.QUICK_RUNS).
VARIANTS = ("raysgd_raydata", "raysgd_loader", "raytrain_raydata")
FIGURES = ("first_epoch_s", "steady_samples_per_s", "wall_s", "peak_mem_mib")


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_data_quick_reports_every_figure(bench_quick):
    run = bench_quick.result("data")  # python -m bench.data --quick --out ...
    document, stdout = run.document(), run.stdout
    assert set(document["variants"]) == set(VARIANTS)
    for name in VARIANTS:
        variant = document["variants"][name]
        assert len(variant["runs"]) == 1 and variant["runs"][0]["ok"], (name, variant["runs"])
        run = variant["runs"][0]
        assert run["samples_per_epoch"] == [run["expected_samples_per_epoch"]] * run["epochs"]
        for figure in FIGURES:
            stats = variant["summary"][figure]
            assert stats and stats["median"] > 0, (name, figure, stats)

    ratios = {(r["ratio"], r["figure"]): r for r in document["ratios"]}
    assert set(ratios) == {("raysgd/Ray Train, Ray Data", "steady_samples_per_s"),
                           ("raysgd/Ray Train, Ray Data", "first_epoch_s"),
                           ("raysgd Ray Data/DataLoader", "steady_samples_per_s"),
                           ("raysgd Ray Data/DataLoader", "first_epoch_s")}
    target = ratios[("raysgd/Ray Train, Ray Data", "steady_samples_per_s")]
    assert target["target"] == ">= 1.0" and target["value"] > 0
    assert target["met"] == (target["value"] >= 1.0)
    for text in ("raysgd/Ray Train, Ray Data", "raysgd Ray Data/DataLoader", ">= 1.0",
                 "steady samples/s", "epoch (s, median)"):
        assert text in stdout, text  # the tables were printed
