"""Variant: raysgd ``TorchTrainer`` with its defaults (commit interval, spares, ...): one
``train(profile=True, reduce_results=False)`` per epoch, timed in the driver.

``--probe`` then adds the commit probe: two calls of the same m steps, the first taking no
in-epoch commit and the second exactly one (at the next multiple of the default interval),
each call ending with its usual commit. The difference of the ranks' (and the whole process
tree's) CPU seconds between the two is the CPU of one in-epoch commit; the second call's
``profile`` says how long that commit held the training thread up. Ray is told the machine's
cores, as ``bench.variants.raysgd_trainer`` does.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

import ray
from torch import nn

import raysgd
from raysgd import TorchTrainer
from raysgd.commits.interval import AUTO, START
from raysgd.utils import BATCH_SIZE

from bench.child import emit, parse_args, set_threads
from bench.procmem import tree_cpu_seconds
from bench.raysgd_operator import BenchOperator
from bench.recovery.raysgd_kill import gpu_settings
from bench.tax import cell_args
from bench.workloads import get_workload


def _extra(parser) -> None:
    cell_args(parser)  # --gpu: bench.recovery.raysgd_kill's gpu_settings
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--probe", action="store_true",
                        help="after the timed epochs, the commit probe (CPU and hold of one "
                             "in-epoch commit)")


def commit_fields(results: List[Dict[str, Any]]) -> Dict[str, Optional[list]]:
    """Per rank, what ``profile`` says of the call's commits: ``commits`` and
    ``commit_hold_s`` (None where this raysgd does not report them)."""
    profiles = [result.get("profile") or {} for result in results]
    return {key: [p.get(key) for p in profiles] if all(key in p for p in profiles) else None
            for key in ("commits", "commit_hold_s")}


def probe_steps(step: int, every: int) -> tuple:
    """``(filler, m)``: a first call of ``filler`` steps (0: none) moves the step count to
    where a call of ``m`` steps takes no in-epoch commit and the next call of ``m`` steps
    exactly one. A call that starts at step g takes one before its batch ``done`` (counted
    from 0; never before the first) when g + done is a multiple of ``every``."""
    gap = every - step % every  # to the next multiple
    filler = gap if gap <= 2 else 0
    gap = every if filler else gap
    return filler, gap // 2 + 1


def in_epoch_commits(start: int, steps: int, every: int) -> int:
    return sum(1 for done in range(1, steps) if (start + done) % every == 0)


def _cpu(pids: List[int]) -> Dict[str, float]:
    tree = tree_cpu_seconds(os.getpid())
    return {"ranks": sum(tree.get(pid, 0.0) for pid in pids), "tree": tree}


def _spent(before: Dict[str, Any], after: Dict[str, Any]) -> Dict[str, float]:
    tree = sum(seconds - before["tree"].get(pid, 0.0) for pid, seconds in after["tree"].items())
    return {"ranks": after["ranks"] - before["ranks"], "tree": tree}


def commit_probe(trainer: TorchTrainer, step: int, pids: List[int]) -> Dict[str, Any]:
    """Two equal calls, without and with one in-epoch commit (see the module's docstring);
    ``pids``: the ranks' processes. A probing trainer commits every ``START`` steps."""
    every = START
    filler, m = probe_steps(step, every)
    if filler:
        trainer.train(num_steps=filler)
        step += filler
    calls = []
    for start in (step, step + m):
        before = _cpu(pids)
        results = trainer.train(num_steps=m, profile=True, reduce_results=False)
        calls.append({"start_step": start, "steps": m, **_spent(before, _cpu(pids)),
                      "expected_in_epoch_commits": in_epoch_commits(start, m, every),
                      **commit_fields(results)})
    without, with_one = calls
    assert (without["expected_in_epoch_commits"], with_one["expected_in_epoch_commits"]) == (0, 1)
    return {"calls": calls, "steps": m, "filler_steps": filler,
            "cpu_per_commit_ranks_s": with_one["ranks"] - without["ranks"],
            "cpu_per_commit_tree_s": with_one["tree"] - without["tree"]}


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    steps_per_epoch = workload.num_samples // workload.batch_size
    ray.init(num_cpus=max(os.cpu_count() or 1, args.num_workers * args.threads),
             include_dashboard=False)
    try:
        strategy = raysgd.FSDP(units=nn.Linear) if args.strategy == "fsdp" else "ddp"
        trainer = TorchTrainer(training_operator_cls=BenchOperator, num_workers=args.num_workers,
                               num_cpus_per_worker=args.threads, strategy=strategy,
                               checkpoint_every_n_steps=START if args.probe else AUTO,
                               **gpu_settings(args),
                               config={BATCH_SIZE: workload.batch_size,
                                       "workload": args.workload, "mode": args.mode})
        # Asked before the timed epochs: apply_all_workers() ends with a commit of its own.
        pids = trainer.apply_all_workers(os.getpid) if args.probe else []
        epoch_s, commits = [], []
        for _ in range(workload.epochs):
            start = time.perf_counter()
            results = trainer.train(profile=True, reduce_results=False)
            epoch_s.append(time.perf_counter() - start)
            commits.append(commit_fields(results))
        spares = len(trainer._supervisor.group.spares)  # the bench reads what the default kept
        interval = trainer.recovery_stats.commit_interval  # the next call's
        probe = (commit_probe(trainer, workload.epochs * steps_per_epoch, pids) if args.probe
                 else None)
        trainer.shutdown()
    finally:
        ray.shutdown()
    steady = (workload.epochs - 1) * workload.num_samples / sum(epoch_s[1:])
    emit({"strategy": args.strategy, "world": args.num_workers, "epoch_s": epoch_s,
          "steady_samples_per_s": steady, "steps_per_epoch": steps_per_epoch,
          "commit_every": START if args.probe else AUTO, "commit_interval": interval,
          "epoch_commits": commits, "spares": spares,
          "probe": probe})


if __name__ == "__main__":
    main()
