"""``python -m bench.data [--quick] [--repeats N] [--variants ...] [--out PATH]``: Ray Data input.

Runs the Ray Data benchmark (issue 15; see ``bench/README.md``, "Ray Data
input"), prints the figures, the ratios and the target, and saves the JSON.
Also reachable as ``python -m bench --data [...]``.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict

from bench.data import NUM_BLOCKS, RAYTRAIN_THROUGHPUT_TARGET
from bench.data.catalog import BY_NAME, RATIOS, Entry, select
from bench.data.report import tables
from bench.launch import REPO_ROOT, common_parser, run_entries, schedule
from bench.report import (compute_ratios, epoch_table, exit_and_figure_problems, metadata_block,
                          save, settle, summarize)
from bench.workloads import get_workload

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "data.json")
WORKLOAD = "mlp"
FULL_REPEATS = 3


def parse_args(argv=None) -> argparse.Namespace:
    parser = common_parser("python -m bench.data", __doc__, DEFAULT_OUT, BY_NAME)
    return parser.parse_args(argv)


def check(run: Dict[str, Any], entry: Entry) -> Dict[str, Any]:
    """A run is ok with exit 0, every figure, and every epoch over the whole data set."""
    problems = exit_and_figure_problems(run, entry.figures)
    expected = run.get("expected_samples_per_epoch")
    samples = run.get("samples_per_epoch")
    if samples is not None and any(count != expected for count in samples):
        problems.append(f"samples per epoch {samples}, expected {expected} each")
    return settle(run, problems)


def describe(run: Dict[str, Any], entry: Entry) -> str:
    if not run["ok"]:
        return "FAILED: " + run["error"].splitlines()[0]
    return (f"{run['steady_samples_per_s']:.0f} samples/s, launch→end of epoch 1 "
            f"{run['first_epoch_s']:.2f}s, wall {run['wall_s']:.1f}s, "
            f"peak {run['peak_mem_mib']:.0f} MiB")


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    repeats = args.repeats or (1 if args.quick else FULL_REPEATS)
    entries = select(args.variants)
    plan = schedule([entry.variant for entry in entries], repeats)
    runs = run_entries(plan, BY_NAME, WORKLOAD, mode, args.timeout, check, describe)
    summaries = {entry.name: summarize(runs[entry.name], entry.figures) for entry in entries}
    ratios = compute_ratios(summaries, RATIOS)
    workload = get_workload(WORKLOAD, mode)
    meta = metadata_block({"benchmark": "data", "workload": WORKLOAD, "mode": mode,
                           "repeats": repeats, "num_samples": workload.num_samples,
                           "global_batch": workload.batch_size, "epochs": workload.epochs,
                           "num_blocks": NUM_BLOCKS,
                           "target_raysgd_over_raytrain_samples_per_s":
                               RAYTRAIN_THROUGHPUT_TARGET})
    print(f"\nRay Data input benchmark: workload {WORKLOAD} ({mode}: {workload.num_samples} "
          f"samples, global batch {workload.batch_size}, {workload.epochs} epochs, the first "
          f"warm-up), 2 workers, {repeats} repetition(s); memory = {meta['memory_method']}")
    print(f"target: raysgd/Ray Train over Ray Data, steady samples/s >= "
          f"{RAYTRAIN_THROUGHPUT_TARGET} (printed, not enforced)\n")
    print(tables(entries, summaries, ratios))
    print(epoch_table(runs, first=1) + "\n")
    variants_doc = {e.name: {"label": e.variant.label,
                             "command": e.variant.command(WORKLOAD, mode),
                             "figures": list(e.figures), "summary": summaries[e.name],
                             "runs": runs[e.name]}
                    for e in entries}
    return save(args.out, meta, variants_doc, ratios, runs)
