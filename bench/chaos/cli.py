"""``python -m bench.chaos [--quick] [--repeats N] [--out PATH]``: run, print, plot, save.

Every run is its own process tree (``bench.chaos.child``). Per repetition, each cell (the
unfaulted one first, then each failure rate) runs the three trainers in an order rotated
by repetition; every trainer of a cell gets the same schedule (seed ``SEED + repetition``).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional

from bench.catalog import Variant
from bench.chaos import (MTBFS_S, NOTICE_S, NUM_WORKERS, QUICK_MTBF_S, QUICK_NOTICE_S,
                         QUICK_UNFAULTED_WINDOW_S, QUICK_WINDOW_S, SEED, UNFAULTED_WINDOW_S,
                         WINDOW_S)
from bench.chaos.plot import write_plot
from bench.chaos.schedule import describe, make_schedule, to_args
from bench.chaos.summary import TRAINERS, cell_key, summarize_cells, targets
from bench.chaos.tables import print_report
from bench.launch import REPO_ROOT, positive, run_once
from bench.report import exit_and_figure_problems, metadata_block, settle, write_json
from bench.workloads import get_workload

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "chaos.json")
WORKLOAD, SIZE = "mlp", "full"  # the quick mode shortens the window, not the workload
BARS = {60.0: 0.92, 20.0: 0.85}  # issue 48's goodput targets by MTBF


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help=f"one {QUICK_WINDOW_S:g} s window at MTBF {QUICK_MTBF_S:g} s, "
                             "one repetition (the suite's smoke run)")
    parser.add_argument("--repeats", type=positive, default=None,
                        help="repetitions per cell (default: 1 quick, 3 full)")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON file (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds before one run is killed (default: its window + 150)")
    return parser.parse_args(argv)


def plan(quick: bool, repeats: int, seed: int) -> List[Dict[str, Any]]:
    """Every run, in order: trainer, rate, window, schedule."""
    window, unfaulted = ((QUICK_WINDOW_S, QUICK_UNFAULTED_WINDOW_S) if quick
                         else (WINDOW_S, UNFAULTED_WINDOW_S))
    rates = [QUICK_MTBF_S] if quick else list(MTBFS_S)
    runs = []
    for rep in range(repeats):
        shift = rep % len(TRAINERS)
        order = TRAINERS[shift:] + TRAINERS[:shift]
        # Quick: only torchrun's unfaulted run, the goodput denominator.
        runs += [{"trainer": t, "mtbf": None, "window": unfaulted, "events": [], "rep": rep}
                 for t in order if not quick or t == "torchrun"]
        for mtbf in rates:
            events = make_schedule(seed + rep, mtbf, window, NUM_WORKERS)
            runs += [{"trainer": t, "mtbf": mtbf, "window": window, "events": events,
                      "rep": rep} for t in order]
    return runs


def _variant(run: Dict[str, Any], notice: float, every: int) -> Variant:
    return Variant(cell_key(run["trainer"], run["mtbf"]), run["trainer"], "bench.chaos.child",
                   ("--trainer", run["trainer"], "--window", str(run["window"]),
                    "--notice", str(notice), "--every", str(every),
                    "--schedule", to_args(run["events"])))


def _check(run: Dict[str, Any]) -> Dict[str, Any]:
    # No first step inside the window is a result (goodput 0), not a failed run.
    return settle(run, exit_and_figure_problems(run, ("samples",)))


def run_plan(runs: List[Dict[str, Any]], notice: float, every: int,
             timeout: Optional[float]) -> Dict[str, List[Dict[str, Any]]]:
    cells: Dict[str, List[Dict[str, Any]]] = {}
    for index, run in enumerate(runs, 1):
        variant = _variant(run, notice, every)
        result = _check(run_once(variant, WORKLOAD, SIZE, timeout or run["window"] + 150))
        result.update(rep=run["rep"], mtbf=run["mtbf"], schedule=describe(run["events"]))
        cells.setdefault(variant.name, []).append(result)
        line = ("FAILED: " + result["error"].splitlines()[0] if not result["ok"] else
                f"{result['samples']} samples, {len(result['events'])} event(s) landed, "
                f"{result['redone_samples']} redone, first step "
                + ("none" if result["first_step_s"] is None else f"{result['first_step_s']:.1f}s")
                + (f", TRAINER ERROR {result['trainer_error'].splitlines()[-1]}"
                   if result.get("trainer_error") else ""))
        print(f"[{index}/{len(runs)}] {variant.name} rep {run['rep']}: {line}",
              file=sys.stderr, flush=True)
    return cells


def main(argv=None) -> int:
    args = parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    notice = QUICK_NOTICE_S if args.quick else NOTICE_S
    workload = get_workload(WORKLOAD, SIZE)
    every = workload.num_samples // workload.batch_size  # the peers checkpoint every epoch
    runs = plan(args.quick, repeats, args.seed)
    mtbfs = sorted({run["mtbf"] for run in runs if run["mtbf"] is not None}, reverse=True)
    for mtbf in mtbfs:
        for rep in range(repeats):
            events = next(r["events"] for r in runs if r["mtbf"] == mtbf and r["rep"] == rep)
            print(f"schedule MTBF {mtbf:g}s, seed {args.seed + rep}: {describe(events)}",
                  file=sys.stderr)
    cells = run_plan(runs, notice, every, args.timeout)
    summaries = summarize_cells(cells)
    rows = targets(summaries, mtbfs, BARS)
    meta = metadata_block({"benchmark": "chaos", "workload": WORKLOAD, "size": SIZE,
                           "quick": args.quick, "repeats": repeats, "seed": args.seed,
                           "window_s": runs[-1]["window"], "notice_s": notice,
                           "peer_checkpoint_every_steps": every,
                           "num_workers": NUM_WORKERS, "mtbfs_s": mtbfs})
    print_report(summaries, rows, meta)
    write_json(args.out, {"meta": meta, "cells": summaries, "targets": rows, "runs": cells})
    print(f"written to {args.out}")
    plot = os.path.splitext(args.out)[0] + ".png"  # beside the JSON, whose folder now exists
    if write_plot(summaries, mtbfs, plot):
        print(f"plot written to {plot}")
    failed = [key for key, runs_ in cells.items() if not all(r["ok"] for r in runs_)]
    if failed:
        print(f"failed runs in: {', '.join(failed)} (see 'error' in the JSON)", file=sys.stderr)
    return 1 if failed else 0
