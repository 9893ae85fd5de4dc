"""``python -m bench.disk [--quick] [--out PATH]``: disk checkpoint cost and resume figures.

1. Cost: epoch time with ``checkpoint_dir`` (a checkpoint at the end of every
   epoch) against without, on the bench MLP and on the digits demo's CNN, both
   with 2 workers, in one process and one Ray (``bench/disk/cost.py``).
2. Resume: the MLP driver SIGKILLed three quarters into epoch 2 and run again
   (``bench/disk/resume.py``): start-up of the resumed run and the steps it redid.

Target (printed, not enforced): a disk checkpoint every epoch costs <= 2 % of
the epoch time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import ray
from tabulate import tabulate

from bench.disk import cost, resume
from bench.launch import REPO_ROOT
from bench.report import metadata_block, write_json

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "disk.json")
COST_TARGET = 0.02


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.disk", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 round (CI smoke)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=DEFAULT_OUT)
    return parser.parse_args(argv)


def _met(cost_figures) -> str:
    """Judged on both: the wall-clock cost (noisy here) and the writer's CPU share."""
    return "yes" if max(cost_figures["cost"], cost_figures["cpu_share"]) <= COST_TARGET else "NO"


def _median(runs, key):
    values = [run[key] for run in runs if run.get(key) is not None]
    return statistics.median(values) if values else None


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    rounds = args.rounds or (1 if args.quick else 3)
    # Workers import bench.* by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="raysgd-bench-disk-") as tmp:
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            blocks = 1 if args.quick else 2 * rounds
            costs = {"mlp": cost.measure("mlp", mode, blocks, 2, tmp),
                     "digits": cost.measure("digits", mode, blocks, 2 if args.quick else 8, tmp)}
        finally:
            ray.shutdown()
        resumes = resume.measure(tmp, mode, 4 if args.quick else 16, rounds)
    print(tabulate([[case, f"{c['epoch_s_none']:.3f}", f"{c['epoch_s_disk']:.3f}",
                     f"{100 * c['cost']:+.1f} %", f"{100 * c['cpu_share']:.1f} %",
                     f"<= {100 * COST_TARGET:.0f} %", _met(c), f"{c['write_s'] * 1000:.0f}",
                     f"{c['write_cpu_s'] * 1000:.1f}", f"{c['checkpoint_mib']:.1f}"]
                    for case, c in costs.items()],
                   headers=["workload", "epoch (s) no disk", "epoch (s) disk every epoch",
                            "cost (wall)", "writer CPU / epoch", "target", "met", "write (ms)",
                            "write CPU (ms)", "checkpoint (MiB)"]))
    print()
    print(tabulate([[f"{_median(resumes, 'fresh_first_step_s'):.2f}",
                     f"{_median(resumes, 'resumed_first_step_s'):.2f}",
                     f"{_median(resumes, 'steps_rerun'):.0f}", resumes[0]["disk_interval"],
                     all(r["final_step"] == r["expected_final_step"] for r in resumes)]],
                   headers=["fresh launch → first step (s)", "resumed launch → first step (s)",
                            "steps re-run", "disk interval", "finished"]))
    write_json(args.out, {"meta": metadata_block({"mode": mode, "rounds": rounds}),
                          "cost": costs, "resume": resumes})
    print(f"\nsaved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
