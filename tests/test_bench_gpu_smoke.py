"""Smoke test for ``python -m bench.gpu --quick``: every variant runs and reports images/s.

On a machine without CUDA the quick mode trains a tiny model on the CPU. It
asserts nothing about speed or the targets; only that each run worked and
that the JSON holds each variant's throughput and the ratios.
"""
import pytest

from bench_runs import WAIT_TIMEOUT_S

PRECISIONS = ("fp32", "fp16", "bf16")
VARIANTS = {f"{kind}_{p}" for kind in ("raysgd", "raysgd_lightning", "loop") for p in PRECISIONS}


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_gpu_quick_reports_throughput_for_every_variant(bench_quick):
    # python -m bench.gpu --quick --out ... (bench_runs.QUICK_RUNS)
    proc = bench_quick.result("gpu", WAIT_TIMEOUT_S)
    document = proc.document()
    assert set(document["variants"]) == VARIANTS
    for name, variant in document["variants"].items():
        assert variant["runs"], name
        for run in variant["runs"]:
            assert run["ok"], f"{name}: {run.get('error')}"
            assert run["images_per_s"] > 0 and run["precision"] == name.split("_")[-1], run
            assert run["device"], run
        assert variant["summary"]["images_per_s"]["median"] > 0, name
    for name in ("raysgd_fp16", "raysgd_lightning_fp16", "loop_fp16"):  # the GradScaler ran
        assert document["variants"][name]["runs"][0]["loss_scale"] > 0, name
    labels = {(ratio["ratio"], ratio["figure"]) for ratio in document["ratios"]}
    assert labels == {(f"raysgd{kind}/loop {p}", "images_per_s") for p in PRECISIONS
                      for kind in ("", " lightning")} | {
        ("loop fp16/fp32", "images_per_s"), ("loop bf16/fp32", "images_per_s")}
    assert "raysgd/loop fp32" in proc.stdout  # the ratios table was printed
