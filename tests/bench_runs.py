"""The benchmarks' quick runs that their smoke tests check.

The smoke tests of the benchmarks in ``QUICK_RUNS`` take theirs from the
session's ``bench_quick`` fixture (``conftest.py``, a :class:`background.Batch`).
The session starts every quick run that its smoke tests will ask for as soon as
it has collected them, one at a time beside the rest of the suite; the smoke
tests run last, and the first of them to ask widens the batch to two at a time;
each test waits for its own. Each run is ``python -m ... --quick --out PATH``
from the repository root, in the environment the session started with and with
a Ray temporary directory of its own (``background``).
"""
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, Iterable, Tuple

from background import Batch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (the smoke test module that asks for it, the module to run, its other arguments).
# Started in this order, longest first, so that the short ones fill the gaps.
QUICK_RUNS: Dict[str, Tuple[str, str, Tuple[str, ...]]] = {
    # Every variant but the recovery benchmark's two kill runs (bench.warm.catalog's
    # RECOVERY_RUNS), which its own quick run makes; a new bench.warm variant goes here too.
    "warm": ("test_bench_warm_smoke", "bench.warm",
             ("--variants", "second_reuse", "second_noreuse", "tune_raysgd", "tune_raytrain",
              "raysgd_recovery_warm")),
    # Variants that only run the same code with another setting (spare_workers=0, another
    # commit interval) are left to the full runs: the suite's CPU time is its bar.
    "recovery": ("test_bench_recovery_smoke", "bench.recovery",
                 ("--variants", "raysgd_recovery", "raysgd_recovery_nospare", "raytrain_recovery",
                  "raysgd_preempt", "raytrain_preempt", "raysgd_commit_none",
                  "raysgd_commit_default")),
    "chaos": ("test_bench_chaos_smoke", "bench.chaos", ()),
    "tax": ("test_bench_tax_smoke", "bench.tax", ()),
    "data": ("test_bench_data_smoke", "bench.data",
             ("--variants", "raysgd_raydata", "raysgd_loader", "raytrain_raydata")),
    "main": ("test_bench_smoke", "bench",
             ("--workload", "mlp", "--variants", "raysgd_2w", "torchrun_2w", "raytrain_2w",
              "plain_1t", "plain_2t", "raysgd_1w", "raysgd_2w_plain_init")),
    "disk": ("test_bench_disk_smoke", "bench.disk", ()),
    "gpu": ("test_bench_gpu_smoke", "bench.gpu", ()),
}
# One run's limit: alone, the longest (recovery) takes 4 minutes; beside the suite on 2 cores
# it took over 8 once (its preemption variant ran 4.5 x slower than alone).
RUN_TIMEOUT_S = 720
# What a smoke test may wait for its run, which may be queued behind others.
WAIT_TIMEOUT_S = 1500


class QuickRun:
    """One finished quick run: its process (``subprocess.CompletedProcess``) and JSON file."""

    def __init__(self, proc: subprocess.CompletedProcess, out: str):
        self.proc, self.out, self.stdout = proc, out, proc.stdout

    def document(self) -> dict:
        """The JSON it saved; fails the test with the run's output tail, and the failed
        runs' own output tails from the JSON, if it failed."""
        assert self.proc.returncode == 0, (self.proc.stdout[-3000:] + self.proc.stderr[-3000:]
                                           + self._failed_runs_errors())
        with open(self.out) as handle:
            return json.load(handle)

    def _failed_runs_errors(self) -> str:
        # A benchmark names a failed run on its progress line and keeps the run's output
        # only in the JSON, which the session's temporary folder loses after the test.
        try:
            with open(self.out) as handle:
                document = json.load(handle)
        except (OSError, ValueError):
            return ""
        errors = []
        for group in ("runs", "variants"):
            for name, runs in (document.get(group) or {}).items():
                runs = runs.get("runs", []) if isinstance(runs, dict) else runs
                errors += [f"\n--- {name}: {run['error']}" for run in runs
                           if isinstance(run, dict) and run.get("error")]
        return "".join(errors)[-6000:]


def smoke_modules() -> set:
    """The test modules whose smoke tests wait for a quick run."""
    return {test_module for test_module, _, _ in QUICK_RUNS.values()}


def _quick(name: str, out_dir: str, batch: Batch) -> QuickRun:
    _, module, args = QUICK_RUNS[name]
    out = os.path.join(out_dir, f"{name}.json")
    # Short: Ray's socket paths under it must stay within the OS's limit (107 bytes).
    ray_tmp = tempfile.mkdtemp(prefix="rbq-", dir="/tmp")
    try:
        proc = batch.run([sys.executable, "-m", module, *args, "--quick", "--out", out],
                         timeout=RUN_TIMEOUT_S, cwd=REPO_ROOT,
                         env={**(batch.env or os.environ), "RAY_TMPDIR": ray_tmp})
    except subprocess.TimeoutExpired as exc:
        proc = subprocess.CompletedProcess(exc.cmd, None, exc.stdout or "",
                                           (exc.stderr or "") + f"\nkilled after {exc.timeout} s")
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    return QuickRun(proc, out)


def quick_jobs(out_dir: str, test_modules: Iterable[str]) -> Dict[str, Callable[[Batch], Any]]:
    """The quick runs the smoke tests among ``test_modules`` ask for, as jobs of the
    session's batch (``conftest``); their JSON in ``out_dir``."""
    selected = set(test_modules)
    return {name: functools.partial(_quick, name, out_dir)
            for name, (test_module, _, _) in QUICK_RUNS.items() if test_module in selected}
