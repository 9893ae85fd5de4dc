"""Runs variants as subprocesses in rotating order and collects their figures."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from bench import RESULT_MARKER, T0_ENV
from bench.catalog import Variant
from bench.procmem import PeakMemory, psutil

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = ("first_step_s", "steady_samples_per_s", "wall_s", "peak_mem_mib")


def schedule(variants: List[Variant], repeats: int) -> List[tuple]:
    """``(rep, variant)`` pairs: every variant once per round, the order rotated each round."""
    pairs = []
    for rep in range(repeats):
        shift = rep % len(variants)
        pairs += [(rep, variant) for variant in variants[shift:] + variants[:shift]]
    return pairs


def run_entries(plan: List[tuple], by_name: Dict[str, Any], workload: str, mode: str,
                timeout_s: float, check: Callable, describe_run: Callable) -> Dict[str, list]:
    """Run a ``schedule`` plan of catalogue entries (``by_name``); each run goes through
    ``check(run, entry)``; progress via ``describe_run(run, entry)`` on stderr."""
    runs: Dict[str, list] = {name: [] for name in dict.fromkeys(v.name for _, v in plan)}
    for index, (rep, variant) in enumerate(plan, 1):
        entry = by_name[variant.name]
        run = {"rep": rep, **check(run_once(variant, workload, mode, timeout_s), entry)}
        runs[variant.name].append(run)
        print(f"[{index}/{len(plan)}] {variant.name}: {describe_run(run, entry)}",
              file=sys.stderr, flush=True)
    return runs


def child_env(threads: int) -> Dict[str, str]:
    """The parent's environment, with the repo importable and the thread count pinned.

    ``RAY_ADDRESS=local``: each Ray-based variant starts (and pays for) its own local Ray
    instead of joining one that happens to be running. Dropping the variable is not
    enough: ``ray.init()`` then joins the cluster a ``ray start`` (or a test's
    ``ray.cluster_utils.Cluster``) left in ``/tmp/ray/ray_current_cluster``, and refuses
    the variant's ``num_cpus`` there.
    """
    env = dict(os.environ, RAY_ADDRESS="local")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


def parse_result(output: str) -> Optional[Dict[str, Any]]:
    """The figures from the last ``BENCH_RESULT`` line, or None."""
    lines = [line for line in output.splitlines() if line.startswith(RESULT_MARKER)]
    return json.loads(lines[-1][len(RESULT_MARKER):]) if lines else None


def _kill_tree(proc: subprocess.Popen) -> None:
    victims = []
    if psutil:
        try:
            victims = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            pass
    proc.kill()
    for child in victims:
        try:
            child.kill()
        except psutil.Error:
            pass
    proc.wait()


def _start(command: List[str], env: Dict[str, str], log) -> tuple:
    env[T0_ENV] = repr(time.time())
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    return proc, float(env[T0_ENV])


def run_once(variant: Variant, workload: str, mode: str, timeout_s: float,
             pss: bool = False) -> Dict[str, Any]:
    """Start ``variant`` once; its figures plus wall time and peak tree memory (with
    ``pss``, also the peak of the tree's summed PSS, ``peak_pss_mib``)."""
    env = child_env(variant.threads)
    with tempfile.TemporaryFile("w+") as log:
        proc, t0 = _start(variant.command(workload, mode), env, log)
        timed_out = False
        with PeakMemory(proc.pid, pss=pss) as peak:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_tree(proc)
        wall_s = time.time() - t0
        log.seek(0)
        output = log.read()
    figures = parse_result(output) or {}
    run = {**figures, "wall_s": wall_s, "peak_mem_mib": peak.mib, "exit_code": proc.returncode}
    if pss:
        run["peak_pss_mib"] = peak.pss_mib
    run["ok"] = proc.returncode == 0 and all(run.get(k) is not None for k in FIGURES)
    if not run["ok"]:
        reason = f"timed out after {timeout_s:.0f}s" if timed_out else f"exit {proc.returncode}"
        run["error"] = f"{reason}; output tail:\n" + output[-3000:]
    return run


def describe(run: Dict[str, Any]) -> str:
    if not run["ok"]:
        return "FAILED: " + run["error"].splitlines()[0]
    return (f"first step {run['first_step_s']:.2f}s, {run['steady_samples_per_s']:.0f} samples/s, "
            f"wall {run['wall_s']:.1f}s, peak {run['peak_mem_mib']:.0f} MiB")


def run_all(variants: List[Variant], workload: str, mode: str, repeats: int,
            timeout_s: float, judge: Callable[[Dict[str, Any]], Dict[str, Any]] = lambda r: r,
            show: Optional[Callable[[Dict[str, Any]], str]] = None) -> Dict[str, List[Dict[str, Any]]]:
    """Every run of every variant, grouped by variant name; progress on stderr.

    ``judge`` may re-decide a run's ``ok`` for a mode with other figures, ``show``
    describes a run in the progress line (default: the main suite's figures).
    """
    show = show or describe
    runs: Dict[str, List[Dict[str, Any]]] = {variant.name: [] for variant in variants}
    plan = schedule(variants, repeats)
    for index, (rep, variant) in enumerate(plan, 1):
        run = {"rep": rep, **judge(run_once(variant, workload, mode, timeout_s))}
        runs[variant.name].append(run)
        print(f"[{index}/{len(plan)}] {variant.name}: {show(run)}", file=sys.stderr,
              flush=True)
    return runs


def positive(text: str) -> int:
    """An argparse type: an integer >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def common_parser(prog: str, description: str, default_out: str, names,
                  quick_help: str = "tiny sizes and 1 repetition (CI smoke: checks it runs)"
                  ) -> argparse.ArgumentParser:
    """The options every benchmark mode takes: --quick, --out, --repeats, --variants, --timeout."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--out", default=default_out, help="JSON file (default: %(default)s)")
    parser.add_argument("--repeats", type=positive, default=None,
                        help="repetitions per variant (default: 1 quick, 3 full)")
    parser.add_argument("--variants", nargs="+", choices=sorted(names),
                        help="run only these (default: all)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before one run is killed (default: %(default)s)")
    return parser

