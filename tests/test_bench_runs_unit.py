"""The smoke tests' view of a failed quick run (``tests/bench_runs.py``): pure, no Ray."""
import json
import subprocess

import pytest

from bench_runs import QuickRun


def _failed(tmp_path, document):
    out = tmp_path / "run.json"
    if document is not None:
        out.write_text(json.dumps(document))
    proc = subprocess.CompletedProcess(["python"], 1, "progress\n", "failed runs in: x\n")
    return QuickRun(proc, str(out))


def test_a_failed_quick_run_shows_its_failed_runs_own_output(tmp_path):
    chaos = {"runs": {"raysgd@10s": [{"ok": False, "error": "exit 1; output tail:\nBoom"}],
                      "torchrun@10s": [{"ok": True}]}}
    with pytest.raises(AssertionError, match=r"(?s)failed runs in.*raysgd@10s: exit 1.*Boom"):
        _failed(tmp_path, chaos).document()
    suite = {"variants": {"raysgd_2w": {"runs": [{"error": "timed out; output tail:\nhung"}]}}}
    with pytest.raises(AssertionError, match=r"(?s)raysgd_2w: timed out.*hung"):
        _failed(tmp_path, suite).document()


def test_a_quick_run_that_wrote_no_json_still_fails_with_its_own_output(tmp_path):
    with pytest.raises(AssertionError, match="failed runs in: x"):
        _failed(tmp_path, None).document()
