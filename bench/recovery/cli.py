"""``python -m bench.recovery [--quick] [--out PATH]``: run, print, save the recovery benchmark.

Also reachable as ``python -m bench --recovery [...]``.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List

from tabulate import tabulate

from bench.launch import REPO_ROOT, common_parser, run_entries, schedule
from bench.recovery import RECOVERY_EPOCHS, RECOVERY_MODE, kill_step
from bench.recovery.catalog import BY_NAME, HEADERS, RATIOS, Entry, select
from bench.report import (cell, compute_ratios, exit_and_figure_problems, metadata_block, save,
                          settle, summarize)
from bench.workloads import NAMES, get_workload

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "recovery.json")

RECOVERY_COLUMNS = ("recovery_s", "recovery_reported_s", "steps_rerun", "steps_lost_reported",
                    "commit_interval", "first_step_s", "wall_s", "peak_mem_mib")
THROUGHPUT_COLUMNS = ("steady_samples_per_s", "first_step_s", "wall_s", "peak_mem_mib")
PREEMPT_COLUMNS = ("notice_to_step_s", "steps_rerun", "first_step_s", "wall_s", "peak_mem_mib")


def parse_args(argv=None) -> argparse.Namespace:
    parser = common_parser("python -m bench.recovery", __doc__, DEFAULT_OUT, BY_NAME)
    parser.add_argument("--workload", choices=NAMES, default="mlp")
    return parser.parse_args(argv)


def check(run: Dict[str, Any], entry: Entry) -> Dict[str, Any]:
    """Re-judge ``run_once``'s ``ok`` by this entry's figures (and a completed, killed run)."""
    return check_figures(run, entry.figures)


def check_figures(run: Dict[str, Any], figures) -> Dict[str, Any]:
    """``check`` by a list of figures (``python -m bench.tax`` uses it too)."""
    problems = exit_and_figure_problems(run, figures)
    if run.get("kill_error"):
        problems.append(f"kill: {run['kill_error']}")
    if "expected_final_step" in run and run.get("final_step") != run["expected_final_step"]:
        problems.append(f"ended at step {run.get('final_step')}, "
                        f"expected {run['expected_final_step']}")
    return settle(run, problems)


def _cell(stats) -> str:
    """``median [min – max]``; whole numbers (steps, intervals) without decimals."""
    if stats and all(float(stats[k]).is_integer() for k in ("median", "min", "max")):
        return "{:.0f} [{:.0f} – {:.0f}]".format(stats["median"], stats["min"], stats["max"])
    return cell(stats)


def describe(run: Dict[str, Any], entry: Entry) -> str:
    if not run["ok"]:
        return "FAILED: " + run["error"].splitlines()[0]
    if entry.kind == "preemption":
        return (f"notice at step {run['noticed_at_step']}, a step elsewhere after "
                f"{run['notice_to_step_s']:.2f}s, {run['steps_rerun']} step(s) re-run, "
                f"wall {run['wall_s']:.1f}s")
    if entry.kind == "recovery":
        own = run.get("recovery_reported_s")
        return (f"kill at step {run['killed_at_step']}, next step after {run['recovery_s']:.2f}s"
                + (f" (raysgd's own {own:.2f}s)" if own is not None else "")
                + f", {run['steps_rerun']} step(s) re-run, wall {run['wall_s']:.1f}s")
    return (f"{run['steady_samples_per_s']:.0f} samples/s, first step {run['first_step_s']:.2f}s, "
            f"wall {run['wall_s']:.1f}s")


def run_all(entries: List[Entry], workload: str, mode: str, repeats: int,
            timeout_s: float) -> Dict[str, List[Dict[str, Any]]]:
    """Every run of every entry, in rotating order; progress on stderr."""
    plan = schedule([entry.variant for entry in entries], repeats)
    return run_entries(plan, BY_NAME, workload, mode, timeout_s, check, describe)


def tables(entries: List[Entry], summaries: Dict[str, Dict[str, Any]],
           ratios: List[Dict[str, Any]]) -> str:
    """The recovery table, the throughput table and the ratios, as text."""
    out = []
    for kind, columns in (("recovery", RECOVERY_COLUMNS), ("preemption", PREEMPT_COLUMNS),
                          ("throughput", THROUGHPUT_COLUMNS)):
        chosen = [entry for entry in entries if entry.kind == kind]
        if not chosen:
            continue
        rows = []
        for entry in chosen:
            stats = summaries[entry.name]
            rows.append([entry.name, entry.variant.label,
                         *(_cell(stats[c]) if c in entry.figures else "-" for c in columns),
                         max((stats[f] or {}).get("n", 0) for f in entry.figures)])
        out.append(tabulate(rows, headers=["variant", "what", *(HEADERS[c] for c in columns),
                                           "n"]))
    ratio_rows = [[r["ratio"], HEADERS.get(r["figure"], r["figure"]), f"{r['value']:.3f}",
                   r["target"] or "-", {True: "yes", False: "NO", None: "-"}[r["met"]]]
                  for r in ratios]
    out.append(tabulate(ratio_rows, headers=["ratio (medians)", "figure", "value", "target",
                                             "met"]))
    return "\n\n".join(out) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    repeats = args.repeats or (1 if args.quick else 3)
    entries = select(args.variants)
    runs = run_all(entries, args.workload, mode, repeats, args.timeout)
    summaries = {entry.name: summarize(runs[entry.name], entry.figures) for entry in entries}
    ratios = compute_ratios(summaries, RATIOS)
    recovery = get_workload(args.workload, RECOVERY_MODE)
    steps_per_epoch = recovery.num_samples // recovery.batch_size
    steady = get_workload(args.workload, mode)
    meta = metadata_block({"benchmark": "recovery", "workload": args.workload, "mode": mode,
                           "repeats": repeats, "recovery_workload_size": RECOVERY_MODE,
                           "recovery_steps_per_epoch": steps_per_epoch,
                           "recovery_epochs": RECOVERY_EPOCHS,
                           "kill_step": kill_step(steps_per_epoch),
                           "throughput_steps_per_epoch": steady.num_samples // steady.batch_size,
                           "throughput_epochs": steady.epochs})
    print(f"\nrecovery benchmark: workload {args.workload}, {repeats} repetition(s); memory = "
          f"{meta['memory_method']}\nrecovery runs: {RECOVERY_MODE} size, {steps_per_epoch} "
          f"steps/epoch, rank 1 killed at step {meta['kill_step']} (epoch 2 of "
          f"{RECOVERY_EPOCHS}); throughput runs: {mode} size, "
          f"{meta['throughput_steps_per_epoch']} steps/epoch, {steady.epochs} epochs\n")
    print(tables(entries, summaries, ratios))
    if args.quick:
        print(f"quick mode: the throughput runs are a smoke check; with "
              f"{meta['throughput_steps_per_epoch']} steps/epoch a commit interval longer than "
              "an epoch never commits inside one, so the commit ratios mean nothing here.\n")
    variants_doc = {e.name: {"label": e.variant.label, "kind": e.kind,
                             "command": e.variant.command(args.workload, mode),
                             "figures": list(e.figures), "summary": summaries[e.name],
                             "runs": runs[e.name]}
                    for e in entries}
    return save(args.out, meta, variants_doc, ratios, runs)
