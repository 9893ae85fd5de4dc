"""``python -m bench.warm [--quick] [--repeats N] [--variants ...] [--out PATH]``: warm workers.

Runs the warm-worker benchmark (issue 14; see ``bench/README.md``, "Warm
workers"), prints one table per kind of run, the issue's targets and the
ratios, and saves the JSON. Also reachable as ``python -m bench --warm [...]``.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List

from bench.launch import REPO_ROOT, common_parser, run_entries, schedule
from bench.recovery import unwarmed_note
from bench.recovery.cli import check as check_exit_and_figures
from bench.report import compute_ratios, metadata_block, save, summarize
from bench.warm import (RECOVERY_WITH_SPARE_TARGET_S, SECOND_TRAINER_TARGET_S, TUNE_TRIALS,
                        TUNE_WORKLOAD_MODE)
from bench.warm.catalog import BY_NAME, RATIOS, Entry, select
from bench.warm.report import judge_targets, tables
from bench.workloads import NAMES

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "warm.json")
FULL_REPEATS = 3


def parse_args(argv=None) -> argparse.Namespace:
    parser = common_parser("python -m bench.warm", __doc__, DEFAULT_OUT, BY_NAME)
    parser.add_argument("--workload", choices=NAMES, default="mlp")
    return parser.parse_args(argv)


def repeats_of(entry: Entry, quick: bool, repeats) -> int:
    """``--repeats`` if given; else 1 in quick mode, the entry's own or 3 in full mode."""
    if repeats:
        return repeats
    return 1 if quick else (entry.full_repeats or FULL_REPEATS)


def check(run: Dict[str, Any], entry: Entry) -> Dict[str, Any]:
    """A run is ok with exit 0, every figure, and (Tune) every trial reported."""
    run = check_exit_and_figures(run, entry)
    if run.get("trials") is not None and run.get("trials_done") != run["trials"]:
        problem = (f"{run.get('trials_done')} of {run['trials']} trials reported "
                   f"(errors: {run.get('trial_errors')})")
        run["ok"] = False
        run["error"] = problem + ("; " + run["error"] if run.get("error") else "")
    return run


def describe(run: Dict[str, Any], entry: Entry) -> str:
    if not run["ok"]:
        return "FAILED: " + run["error"].splitlines()[0]
    if entry.kind == "second":
        return (f"trainer #1 {run['first_trainer_s']:.2f}s, trainer #2 {run['second_trainer_s']:.2f}s"
                f" (same pids: {'yes' if run['same_pids'] else 'no'}), wall {run['wall_s']:.1f}s")
    if entry.kind == "tune":
        return (f"{run['trials_done']} trials in {run['total_s']:.1f}s "
                f"({run['per_trial_s']:.2f}s each), {run['distinct_worker_pids']} worker pids, "
                f"wall {run['wall_s']:.1f}s")
    return (f"kill at step {run['killed_at_step']}, next step after {run['recovery_s']:.2f}s"
            f"{unwarmed_note(run)}, {run['steps_rerun']} step(s) re-run, wall {run['wall_s']:.1f}s")


def run_all(entries: List[Entry], workload: str, mode: str, counts: Dict[str, int],
            timeout_s: float) -> Dict[str, List[Dict[str, Any]]]:
    """``counts[name]`` runs of every entry, in rotating order; progress on stderr."""
    plan = [(rep, variant) for rep, variant
            in schedule([entry.variant for entry in entries], max(counts.values()))
            if rep < counts[variant.name]]
    return run_entries(plan, BY_NAME, workload, mode, timeout_s, check, describe)


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    entries = select(args.variants)
    counts = {entry.name: repeats_of(entry, args.quick, args.repeats) for entry in entries}
    runs = run_all(entries, args.workload, mode, counts, args.timeout)
    summaries = {entry.name: summarize(runs[entry.name], entry.figures) for entry in entries}
    ratios = compute_ratios(summaries, RATIOS)
    targets = judge_targets(summaries)
    meta = metadata_block({"benchmark": "warm", "workload": args.workload, "mode": mode,
                           "repeats": counts, "tune_trials": TUNE_TRIALS[mode],
                           "tune_workload_size": TUNE_WORKLOAD_MODE,
                           "targets_s": {"second_trainer": SECOND_TRAINER_TARGET_S,
                                         "recovery_with_spare": RECOVERY_WITH_SPARE_TARGET_S}})
    print(f"\nwarm-worker benchmark: workload {args.workload} ({mode}); repetitions "
          f"{', '.join(f'{name} {count}' for name, count in counts.items())}; Tune: "
          f"{TUNE_TRIALS[mode]} trials of one epoch ({TUNE_WORKLOAD_MODE} size), one at a time; "
          f"memory = {meta['memory_method']}\n")
    print(tables(entries, summaries, targets, ratios))
    variants_doc = {e.name: {"label": e.variant.label, "kind": e.kind,
                             "command": e.variant.command(args.workload, mode),
                             "figures": list(e.figures), "summary": summaries[e.name],
                             "runs": runs[e.name]}
                    for e in entries}
    return save(args.out, {**meta, "targets": targets}, variants_doc, ratios, runs)
