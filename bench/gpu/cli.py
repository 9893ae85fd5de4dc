"""``python -m bench.gpu [--quick] [--out PATH]``: run, print, save the GPU precision benchmark.

Also reachable as ``python -m bench --gpu [...]``.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any, Dict, List

import torch
from tabulate import tabulate

from bench.catalog import Variant
from bench.gpu import NEEDS_CUDA, RAYSGD_USE_FP16
from bench.gpu.catalog import BY_NAME, FIGURES, HEADERS, OPTIONAL_FIGURES, RATIOS, select
from bench.gpu.workload import GpuWorkload, get_workload
from bench.launch import REPO_ROOT, common_parser, positive, run_all
from bench.report import (cell, compute_ratios, metadata_block, ratio_table, save, settle,
                          summarize)

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "gpu.json")
COLUMNS = ("images_per_s", "gpu_mem_mib", "loss_scale", "wall_s", "peak_mem_mib")


def parse_args(argv=None) -> argparse.Namespace:
    parser = common_parser("python -m bench.gpu", __doc__, DEFAULT_OUT, BY_NAME,
                           quick_help="tiny model, CPU allowed, 1 repetition (CI smoke: checks "
                                      "it runs)")
    parser.add_argument("--steps", type=positive, default=None,
                        help="timed steps per run (default: 3 quick, 50 full)")
    parser.add_argument("--warmup", type=positive, default=None,
                        help="warm-up steps per run (default: 2 quick, 10 full)")
    return parser.parse_args(argv)


def with_run_args(variant: Variant, device: str, workload: GpuWorkload) -> Variant:
    """``variant`` with the device and step counts every run of this invocation uses."""
    return dataclasses.replace(variant, args=variant.args + (
        "--device", device, "--warmup", str(workload.warmup_steps),
        "--steps", str(workload.timed_steps)))


def check(run: Dict[str, Any]) -> Dict[str, Any]:
    """Re-judge ``run_once``'s ``ok`` (made for the main suite's figures) by this mode's."""
    problems = [] if run.get("exit_code") == 0 else [f"exit {run.get('exit_code')}"]
    missing = [figure for figure in FIGURES if run.get(figure) is None]
    if missing:
        problems.append(f"missing figures {missing}")
    return settle(run, problems)


def describe(run: Dict[str, Any]) -> str:
    if not run["ok"]:
        return "FAILED: " + run["error"].splitlines()[0]
    scale = f", loss scale {run['loss_scale']:g}" if run.get("loss_scale") else ""
    return (f"{run['images_per_s']:.1f} images/s ({run['timed_steps']} steps in "
            f"{run['timed_s']:.2f}s){scale}, wall {run['wall_s']:.1f}s")


def summarize_runs(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """``bench.report.summarize`` over the required figures plus the optional ones all runs have."""
    good = [run for run in runs if run["ok"]]
    present = [f for f in OPTIONAL_FIGURES if good and all(r.get(f) is not None for r in good)]
    summary = summarize(runs, FIGURES + tuple(present))
    return {**{figure: None for figure in OPTIONAL_FIGURES}, **summary}


def tables(variants: List[Variant], summaries: Dict[str, Dict[str, Any]],
           ratios: List[Dict[str, Any]]) -> str:
    """The figures table (median [min – max]; "-" where a figure does not apply) and the ratios."""
    rows = []
    for variant in variants:
        stats = summaries[variant.name]
        cells = [cell(stats[c]) if stats[c] or c in FIGURES else "-" for c in COLUMNS]
        rows.append([variant.name, variant.label, *cells,
                     max((stats[f] or {}).get("n", 0) for f in FIGURES)])
    figures = tabulate(rows, headers=["variant", "what", *(HEADERS[c] for c in COLUMNS), "n"])
    return f"{figures}\n\n{ratio_table(ratios, HEADERS)}\n"


def device_names(runs: Dict[str, List[Dict[str, Any]]]) -> List[str]:
    return sorted({run["device"] for variant_runs in runs.values() for run in variant_runs
                   if run.get("device")})


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    cuda = torch.cuda.is_available()
    if not args.quick and not cuda:
        # ResNet-50 at batch 128 on CPU would take hours and measure nothing useful.
        print(f"python -m bench.gpu: {NEEDS_CUDA}", file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    repeats = args.repeats or (1 if args.quick else 3)
    workload = get_workload(mode, args.warmup, args.steps)
    variants = [with_run_args(v, device, workload) for v in select(args.variants)]
    runs = run_all(variants, workload.name, mode, repeats, args.timeout, judge=check,
                   show=describe)
    summaries = {v.name: summarize_runs(runs[v.name]) for v in variants}
    ratios = compute_ratios(summaries, RATIOS)
    meta = metadata_block({
        "benchmark": "gpu", "mode": mode, "repeats": repeats, "device_type": device,
        "device_names": device_names(runs), "model": workload.name,
        "input_shape": list(workload.input_shape), "num_classes": workload.num_classes,
        "batch_size": workload.batch_size, "warmup_steps": workload.warmup_steps,
        "timed_steps": workload.timed_steps, "pool_batches": workload.pool_batches,
        "raysgd_use_fp16": RAYSGD_USE_FP16})
    print(f"\nGPU precision benchmark: {workload.name} ({mode}), batch {workload.batch_size}, "
          f"{workload.warmup_steps} warm-up + {workload.timed_steps} timed steps, "
          f"device {', '.join(meta['device_names']) or device}, {repeats} repetition(s); "
          f"memory = {meta['memory_method']}\n")
    print(tables(variants, summaries, ratios))
    if args.quick:
        print("quick mode: a smoke check on a tiny model with a handful of steps; the ratios "
              "mean nothing here.\n")
    variants_doc = {v.name: {"label": v.label, "command": v.command(workload.name, mode),
                             "summary": summaries[v.name], "runs": runs[v.name]}
                    for v in variants}
    return save(args.out, meta, variants_doc, ratios, runs)
