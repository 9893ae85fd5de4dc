"""``python -m bench.disk [--quick] [--out PATH]``: checkpoint cost and resume figures.

1. DDP cost: epoch time with ``checkpoint_dir`` (a checkpoint at the end of every
   epoch) against without, on the bench MLP (to local disk and to S3) and on the digits
   demo's CNN, with 2 workers, in one process and one Ray (``bench/disk/cost.py``).
2. FSDP cost: a checkpoint every 20 steps against none, to local disk and to S3, the shards
   written as raysgd chooses on CPUs (in place), and once more in the background
   (``dcp.async_save``, raysgd's choice on GPUs) for comparison (``bench/disk/fsdp_cost.py``).
3. Resume: the MLP driver SIGKILLed three quarters into epoch 2 and run again
   (``bench/disk/resume.py``): start-up of the resumed run and the steps it redid.

S3 is moto's server on this machine (``bench/disk/s3.py``). Targets (printed, not
enforced): DDP, a checkpoint every epoch <= 1 % of the epoch (MLP); FSDP, every 20 steps
<= 3 %; both to local disk and to S3.

On a machine with cores to spare, ``--training-cpus 0,1 --endpoint-cpus 2-5`` keeps this
process, its Ray and every worker on two cores (the 2-core machine the targets are set
for) and moto on others, so the endpoint takes no CPU from training, as a remote one would
not.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import ray
from tabulate import tabulate

from bench.disk import cost, fsdp_cost, resume
from bench.disk.s3 import LocalS3, parse_cpus, pin_process
from bench.launch import REPO_ROOT
from bench.report import metadata_block, write_json

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "disk.json")
DDP_TARGET, FSDP_TARGET, DIGITS_TARGET = 0.01, 0.03, 0.02


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.disk", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 round (CI smoke)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--cases", nargs="*", default=None,
                        help="only these cost cases (names as in the table); skips the resume part")
    parser.add_argument("--training-cpus", type=parse_cpus, default=None, metavar="LIST",
                        help="run this process, Ray and the workers on these CPUs only (e.g. 0,1)")
    parser.add_argument("--endpoint-cpus", type=parse_cpus, default=None, metavar="LIST",
                        help="run the S3 endpoint on these CPUs (e.g. 2-5; default: any, nice 19)")
    args = parser.parse_args(argv)
    if args.training_cpus and args.endpoint_cpus and args.training_cpus & args.endpoint_cpus:
        parser.error("--training-cpus and --endpoint-cpus share CPUs "
                     f"{sorted(args.training_cpus & args.endpoint_cpus)}; give disjoint lists")
    return args


def _met(figures, target) -> str:
    """Judged on the wall-clock cost and the CPU one (DDP: the writer thread's CPU share of
    an epoch; FSDP: the CPU every process added)."""
    cpu = figures.get("cpu_share", figures.get("cpu_cost", 0.0))
    return "yes" if max(figures["cost"], cpu) <= target else "NO"


def _costs(args, mode, tmp) -> dict:
    rounds = args.rounds or (1 if args.quick else 3)
    blocks = 1 if args.quick else 2 * rounds
    fsdp_blocks = 1 if args.quick else rounds
    fsdp_epochs = 1 if args.quick else 2  # timed epochs per block
    s3 = LocalS3(args.endpoint_cpus)
    if args.training_cpus:  # Ray's processes, started below, inherit it
        pin_process(args.training_cpus)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        cases = (("ddp mlp, local", DDP_TARGET, lambda: cost.measure("mlp", mode, blocks, 2, tmp)),
                 ("ddp mlp, s3", DDP_TARGET,
                  lambda: cost.measure("mlp", mode, blocks, 2, tmp, s3.new_run())),
                 ("ddp digits, local", DIGITS_TARGET, lambda: cost.measure(
                     "digits", mode, blocks, 2 if args.quick else 8, tmp)),
                 ("fsdp every 20, local", FSDP_TARGET, lambda: fsdp_cost.measure(
                     mode, fsdp_blocks, fsdp_epochs, os.path.join(tmp, "fsdp"))),
                 ("fsdp every 20, s3", FSDP_TARGET, lambda: fsdp_cost.measure(
                     mode, fsdp_blocks, fsdp_epochs, s3.new_run())),
                 ("fsdp every 20, local, async", FSDP_TARGET, lambda: fsdp_cost.measure(
                     mode, fsdp_blocks, fsdp_epochs, os.path.join(tmp, "async"),
                     async_checkpoints=True)))
        costs = {}
        for name, target, run in cases:
            if args.cases and name not in args.cases:
                continue
            endpoint_before = s3.cpu_seconds()
            figures = run()
            if ", s3" in name:  # what the local endpoint took, which a remote one would not
                figures["endpoint_cpu_s"] = s3.cpu_seconds() - endpoint_before
            costs[name] = (figures, target)
            print(f"{name}: {100 * figures['cost']:+.1f} %", file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
        s3.stop()
    return costs


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
        costs = _costs(args, mode, tmp)
        resumes = [] if args.cases else resume.measure(tmp, mode, 4 if args.quick else 16, rounds)
    print(tabulate([[case, f"{c['epoch_s_none']:.3f}", f"{c['epoch_s_disk']:.3f}",
                     f"{100 * c['cost']:+.1f} %",
                     f"{100 * c['cpu_share']:.1f} %" if "cpu_share" in c else
                     f"{100 * c['cpu_cost']:+.1f} %" if "cpu_cost" in c else "-",
                     f"<= {100 * target:.0f} %", _met(c, target) if c.get("async_checkpoints") is None else "-",
                     f"{c['write_s'] * 1000:.0f}", f"{c['checkpoint_mib']:.1f}",
                     f"{c['endpoint_cpu_s']:.1f}" if "endpoint_cpu_s" in c else "-"]
                    for case, (c, target) in costs.items()],
                   headers=["workload, storage", "epoch (s) none", "epoch (s) checkpoints",
                            "cost (wall)", "cost (CPU)", "target", "met",
                            "write (ms)", "checkpoint (MiB)", "endpoint CPU (s)"]))
    print()
    if resumes:
        print(tabulate([[f"{_median(resumes, 'fresh_first_step_s'):.2f}",
                         f"{_median(resumes, 'resumed_first_step_s'):.2f}",
                         f"{_median(resumes, 'steps_rerun'):.0f}", resumes[0]["disk_interval"],
                         all(r["final_step"] == r["expected_final_step"] for r in resumes)]],
                       headers=["fresh launch → first step (s)", "resumed launch → first step (s)",
                                "steps re-run", "disk interval", "finished"]))
    pinned = {"training_cpus": sorted(args.training_cpus or ()),
              "endpoint_cpus": sorted(args.endpoint_cpus or ())}
    write_json(args.out, {"meta": metadata_block({"mode": mode, "rounds": rounds, **pinned}),
                          "cost": {case: dict(c, target=t) for case, (c, t) in costs.items()},
                          "resume": resumes})
    print(f"\nsaved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
