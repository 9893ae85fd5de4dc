"""Smoke test for ``python -m bench.chaos --quick``: every trainer ran its window under the
same schedule and every figure came out.

It asserts nothing about goodput or the targets: only that each run worked, that events
landed on each trainer, and that the JSON, the plot and the printed tables hold the figures.
"""
import os

import pytest

from bench_runs import WAIT_TIMEOUT_S

CELLS = {"torchrun@none", "raysgd@10s", "raytrain@10s", "torchrun@10s", "torchft@10s"}


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_chaos_quick_reports_goodput_for_every_trainer(bench_quick):
    # python -m bench.chaos --quick --out ... (bench_runs.QUICK_RUNS)
    run = bench_quick.result("chaos", WAIT_TIMEOUT_S)
    document, stdout = run.document(), run.stdout
    assert set(document["cells"]) == CELLS
    schedules = set()
    for key, runs in document["runs"].items():
        for one in runs:
            assert one["ok"], (key, one.get("error"))
            if key != "torchrun@none":
                schedules.add(one["schedule"])
            # Ray Train takes 12 s to its first step alone; beside the other quick runs it
            # may not train (so nothing lands on it) inside the 30 s window: goodput 0. And
            # its controller actor may sit on a node the schedule takes: fit() then raises
            # (a ControllerError, seen here), an outcome the benchmark reports, not a failure.
            if not key.startswith("raytrain"):
                assert not one["trainer_error"], (key, one["trainer_error"])
                assert one["samples"] > 0 and one["first_step_s"] > 0, (key, one)
                assert key == "torchrun@none" or any(e["landed"] for e in one["applied"])
    assert len(schedules) == 1  # the same schedule for every trainer
    for key in CELLS - {"torchrun@none"}:
        cell = document["cells"][key]
        assert 0 <= cell["goodput"]["median"] < 2, (key, cell["goodput"])
        assert key.startswith("raytrain") or cell["pause_s"] and cell["breakdown"], (key, cell)
    assert document["cells"]["torchrun@none"]["steady_samples_per_s"]["median"] > 0
    assert {"raysgd/Ray Train", "raysgd/torchft", "raysgd/torchrun"} <= {
        row["target"].split(" goodput")[0] for row in document["targets"]}
    assert os.path.getsize(os.path.splitext(run.out)[0] + ".png") > 0
    assert "goodput" in stdout and "lost s/event" in stdout
