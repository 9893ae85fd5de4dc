"""Runs a benchmark's quick mode the way the smoke tests do, for those tests."""
import json
import os
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_quick(module: str, out) -> tuple:
    """``python -m module --quick --out out`` from the repository root; (document, stdout).
    A failed run fails the test with the tail of its output."""
    proc = subprocess.run([sys.executable, "-m", module, "--quick", "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), proc.stdout
