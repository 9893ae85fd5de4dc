"""Smoke test for ``python -m bench.disk --quick``: both parts run and report every figure.

Nothing about speed is asserted (the 2 % target is printed, not enforced); only
that the cost part timed both kinds of epochs and wrote checkpoints, and that
the SIGKILLed driver's second run resumed mid-run and finished.
"""
import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_disk_quick_reports_cost_and_resume(tmp_path):
    out = tmp_path / "disk.json"
    run = subprocess.run([sys.executable, "-m", "bench.disk", "--quick", "--out", str(out)],
                         cwd=REPO_ROOT, capture_output=True, text=True, timeout=280)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "resumed launch → first step (s)" in run.stdout and "cost" in run.stdout
    document = json.loads(out.read_text())
    for case in ("mlp", "digits"):
        cost = document["cost"][case]
        assert cost["epochs_timed"] >= 2 and cost["epoch_s_none"] > 0 and cost["epoch_s_disk"] > 0
        assert cost["write_s"] > 0 and cost["checkpoint_mib"] > 0
    for resume in document["resume"]:
        assert resume["final_step"] == resume["expected_final_step"]
        assert 0 < resume["resumed_from_step"] <= resume["step_at_kill"]
        # The interval since the last checkpoint on disk, plus one more when the driver was
        # killed holding a commit it had not written yet (the orphaned workers run on to
        # their next commit before Ray reaps them).
        assert resume["steps_rerun"] <= 2 * resume["disk_interval"] + 2
        assert resume["resumed_first_step_s"] > 0
