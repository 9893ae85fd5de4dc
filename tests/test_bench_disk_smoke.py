"""Smoke test for ``python -m bench.disk --quick``: both parts run and report every figure.

Nothing about speed is asserted (the targets are printed, not enforced); only
that the cost part timed both kinds of epochs and wrote checkpoints (DDP and FSDP, to
local disk and to a local S3 endpoint), and that
the SIGKILLed driver's second run resumed mid-run and finished.
"""
import pytest

from bench_runs import WAIT_TIMEOUT_S


@pytest.mark.slow
@pytest.mark.timeout(WAIT_TIMEOUT_S + 60)
def test_bench_disk_quick_reports_cost_and_resume(bench_quick):
    # python -m bench.disk --quick --out ... (bench_runs.QUICK_RUNS)
    run = bench_quick.result("disk", WAIT_TIMEOUT_S)
    document = run.document()
    assert "resumed launch → first step (s)" in run.stdout and "cost" in run.stdout
    assert sorted(document["cost"]) == sorted([
        "ddp mlp, local", "ddp mlp, s3", "ddp digits, local", "fsdp every 20, local",
        "fsdp every 20, s3", "fsdp every 20, local, async"])
    for case, cost in document["cost"].items():
        assert cost["epochs_timed"] >= 1 and cost["epoch_s_none"] > 0 and cost["epoch_s_disk"] > 0
        assert cost["write_s"] > 0 and cost["checkpoint_mib"] > 0, case
    for case in ("fsdp every 20, local", "fsdp every 20, s3"):
        # In-epoch checkpoints were due and handed to the writer. How many it writes
        # depends on the load (a newer one replaces a pending one); write_s > 0 above says
        # some were written.
        assert document["cost"][case]["in_epoch_due"] >= 3, case
    for resume in document["resume"]:
        assert resume["final_step"] == resume["expected_final_step"]
        assert 0 < resume["resumed_from_step"] <= resume["step_at_kill"]
        # The interval since the last checkpoint on disk, plus one more when the driver was
        # killed holding a commit it had not written yet (the orphaned workers run on to
        # their next commit before Ray reaps them).
        assert resume["steps_rerun"] <= 2 * resume["disk_interval"] + 2
        assert resume["resumed_first_step_s"] > 0
