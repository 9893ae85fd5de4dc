"""``python -m bench.tax [--quick] [--gpu] [--out PATH] [--sizes small,medium,large]
[--strategies ddp,fsdp] [--repeats N]``: run every cell, print its figures and the bars, save.

Per cell (strategy × size): ``--repeats`` runs of raysgd (``bench.tax.raysgd_run``), of
the loop (``bench.tax.loop`` under torchrun) and (not with ``--quick``) of the loop with huge
pages as raysgd's ranks have them (``bench.tax.loop_huge``), interleaved r, l, h, r, l, h,
..., each a fresh process tree whose peak summed PSS and RSS the parent samples; the first
raysgd run also takes the commit probe. Then one kill run (``bench.tax.kills``: rank 1
SIGKILLed in three calls in a row; ``--quick``: the DDP small cell only). Before the cells, one process
times a plain copy of one rank's state per size (``bench.tax.copy_probe``).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from typing import Any, Dict, List, Optional, Tuple

from bench.catalog import Variant
from bench.launch import REPO_ROOT, child_env, parse_result, positive, run_once
from bench.recovery.cli import check_figures
from bench.report import metadata_block, write_json
from bench.tax import SIZES, STRATEGIES, ranks, workload_name
from bench.tax.report import add_growth, bars, cell_summary, print_report

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "tax.json")
TIMED = ("steady_samples_per_s", "epoch_s", "peak_pss_mib", "peak_mem_mib")
KILLED = ("steps_rerun", "recovery_s", "growth_over_state")
# --quick: enough cells for every column (two DDP sizes give the memory that grows with the
# state) in about a minute; the suite runs it.
QUICK_CELLS = (("ddp", "small"), ("ddp", "medium"), ("fsdp", "small"))
QUICK_KILL = ("ddp", "small")


def _names(allowed):
    def parse(text: str) -> List[str]:
        names = [name for name in text.split(",") if name]
        unknown = sorted(set(names) - set(allowed))
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"choose from {','.join(allowed)}, got {text!r}")
        return [name for name in allowed if name in names]  # in the table's order
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.tax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, 1 repetition, the cells of QUICK_CELLS only, one "
                             "kill run (ddp/small) (CI smoke: checks every column runs)")
    parser.add_argument("--gpu", action="store_true",
                        help="the ranks on the machine's GPU (DDP: 2 ranks share it on gloo; "
                             "FSDP: 1 rank on NCCL)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON file (default: %(default)s)")
    parser.add_argument("--sizes", type=_names(SIZES), default=None,
                        help=f"comma-separated, of {','.join(SIZES)} (default: all)")
    parser.add_argument("--strategies", type=_names(STRATEGIES), default=None,
                        help=f"comma-separated, of {','.join(STRATEGIES)} (default: all)")
    parser.add_argument("--repeats", type=positive, default=None,
                        help="runs of raysgd and of the loop per cell (default: 1 quick, 3 full)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds before one run is killed (default: %(default)s)")
    return parser.parse_args(argv)


def cell_variants(strategy: str, size: str, gpu: bool) -> Dict[str, Variant]:
    """The cell's three commands: raysgd, the loop, the kill run (raysgd's ``--probe`` is
    added to the first run). The kill run trains the size's full shape whatever the mode
    (``bench.recovery.RECOVERY_MODE``): a quick epoch ends before the kill lands."""
    n = ranks(strategy, gpu)
    common = ("--strategy", strategy) + (("--gpu",) if gpu else ())
    label = f"{strategy}/{size}"
    return {
        "raysgd": Variant(f"raysgd {label}", "raysgd TorchTrainer, defaults",
                          "bench.tax.raysgd_run", common + ("--num-workers", str(n))),
        "loop": Variant(f"loop {label}", f"torchrun {strategy} loop", "bench.tax.loop",
                        common, torchrun_procs=n),
        "loop_huge": Variant(f"loop+THP {label}", f"torchrun {strategy} loop, huge pages",
                             "bench.tax.loop_huge", common, torchrun_procs=n),
        "kill": Variant(f"kills {label}", "raysgd defaults, rank 1 SIGKILLed in 3 calls in a row",
                        "bench.tax.kills", common + ("--num-workers", str(n))
                        + (("--victim-rank", "0") if n == 1 else ())),
    }


def describe(run: Dict[str, Any]) -> str:
    if not run["ok"]:
        return "FAILED: " + run["error"].splitlines()[0]
    if "steps_rerun" in run:
        return (f"kills: {run['steps_rerun_per_call']} step(s) re-run (worst at interval "
                f"{run.get('commit_interval')}), next step after {run['recovery_s']:.2f}s "
                f"(median), peak growth ÷ state {run['growth_over_state']:.2f}, "
                f"wall {run['wall_s']:.1f}s")
    return (f"{run['steady_samples_per_s']:.0f} samples/s, epochs "
            + " ".join(f"{s:.2f}" for s in run["epoch_s"])
            + f" s, peak PSS {run['peak_pss_mib']:.0f} MiB, wall {run['wall_s']:.1f}s")


def _one(variant: Variant, size: str, mode: str, timeout_s: float, figures,
         progress: str) -> Dict[str, Any]:
    run = check_figures(run_once(variant, workload_name(size), mode, timeout_s, pss=True), figures)
    print(f"[{progress}] {variant.name}: {describe(run)}", file=sys.stderr, flush=True)
    return run


def copy_probe(sizes: List[str], mode: str, gpu: bool, timeout_s: float) -> Dict[str, Any]:
    """``bench.tax.copy_probe`` in its own process: per size, state bytes and copy times."""
    shares = sorted({1, *(ranks(s, gpu) for s in STRATEGIES)})
    command = [sys.executable, "-m", "bench.tax.copy_probe", "--mode", mode,
               "--sizes", ",".join(sizes), "--ranks", ",".join(map(str, shares))]
    try:
        out = subprocess.run(command + (["--gpu"] if gpu else []), capture_output=True,
                             text=True, timeout=timeout_s, cwd=REPO_ROOT, env=child_env(1))
        result = parse_result(out.stdout)
        error: Optional[str] = None if result else (out.stdout + out.stderr)[-3000:]
    except subprocess.TimeoutExpired:
        result, error = None, f"timed out after {timeout_s:.0f}s"
    print(f"[copy probe] {error.splitlines()[-1] if error else 'done'}", file=sys.stderr,
          flush=True)
    return {"sizes": result or {}, "error": error}


def chosen_cells(args: argparse.Namespace) -> List[Tuple[str, str]]:
    """(strategy, size) of every cell to run: the sizes and strategies asked for (default:
    all; ``--quick``: those of ``QUICK_CELLS``)."""
    sizes, strategies = args.sizes or list(SIZES), args.strategies or list(STRATEGIES)
    cells = [(strategy, size) for size in sizes for strategy in strategies]
    if args.quick and not (args.sizes or args.strategies):
        cells = [cell for cell in cells if cell in QUICK_CELLS]
    return cells


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    repeats = args.repeats or (1 if args.quick else 3)
    cells = chosen_cells(args)
    sizes = [size for size in SIZES if any(size == z for _, z in cells)]
    copies = copy_probe(sizes, mode, args.gpu, args.timeout)
    killed = [cell for cell in cells if not args.quick or cell == QUICK_KILL]
    # The loop with raysgd's allocator (huge pages) too, except in the CI smoke.
    timed = ("raysgd", "loop") if args.quick else ("raysgd", "loop", "loop_huge")
    total = len(cells) * len(timed) * repeats + len(killed)
    done, results = 0, {}
    for strategy, size in cells:
        variants = cell_variants(strategy, size, args.gpu)
        runs: Dict[str, list] = {"raysgd": [], "loop": [], "loop_huge": [], "kill": []}
        for rep in range(repeats):
            probe = ("--probe",) if rep == 0 else ()
            raysgd = dataclasses.replace(variants["raysgd"], args=variants["raysgd"].args + probe)
            for kind in timed:
                variant, figures = (raysgd, TIMED + ("probe",) * bool(probe)) \
                    if kind == "raysgd" else (variants[kind], TIMED)
                done += 1
                runs[kind].append({"rep": rep, **_one(variant, size, mode, args.timeout,
                                                      figures, f"{done}/{total}")})
        if (strategy, size) in killed:
            done += 1
            runs["kill"].append(_one(variants["kill"], size, mode, args.timeout, KILLED,
                                     f"{done}/{total}"))
        n = ranks(strategy, args.gpu)
        results[f"{strategy}/{size}"] = {
            "strategy": strategy, "size": size, "ranks": n,
            "commands": {kind: v.command(workload_name(size), mode)
                         for kind, v in variants.items()},
            "summary": cell_summary(runs, copies["sizes"].get(size), strategy, n),
            "runs": runs}
    add_growth(results)
    table = bars(results)
    meta = metadata_block({"benchmark": "tax", "mode": mode, "repeats": repeats,
                           "gpu": args.gpu, "cells": [f"{s}/{z}" for s, z in cells]})
    print_report(results, table, meta, copies)
    write_json(args.out, {"meta": meta, "copy_probe": copies, "cells": results, "bars": table})
    print(f"written to {args.out}")
    failed = [f"{cell} {kind}" for cell, doc in results.items()
              for kind, kind_runs in doc["runs"].items() if not all(r["ok"] for r in kind_runs)]
    if copies["error"]:
        failed.append("copy probe")
    if failed:
        print(f"failed: {', '.join(failed)} (see 'error' in the JSON)", file=sys.stderr)
    return 1 if failed else 0
