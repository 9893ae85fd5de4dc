"""Variant: raysgd's defaults, with rank 1 (``--victim-rank``) SIGKILLed in each of ``--kills`` calls in a row and
no CPU free for a spare (Ray is given the ranks' CPUs only), as a job on preemptible nodes
meets it. Per call: the process tree's peak PSS (``bench.procmem.PeakMemory``), the steps
redone and the seconds from the kill to the next step.

A commit path that keeps what each failure left behind grows call by call: issue 70 measured
about 1.3 × the state per failure. ``growth_over_state`` is the last call's peak beyond the
first's, ÷ the state (the model's parameters and Adam's state, all ranks' shards together:
what one commit holds). Warm-up is one call without a kill, so the first kill's call already
has every commit buffer the run makes.
"""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from typing import Any, Dict, List

import ray
from torch import nn

import raysgd
from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import emit
from bench.procmem import PeakMemory, tree_pss
from bench.recovery import RECOVERY_MODE, start_kill_run
from bench.recovery.raysgd_kill import gpu_settings
from bench.recovery.step_operator import StepLogOperator
from bench.recovery.steplog import Killer, analyse, read_log, read_pid, read_setups

ADAM_TENSORS = 3  # a parameter, exp_avg, exp_avg_sq
MIB = 2**20


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--kills", type=int, default=3, help="calls in a row with a kill")
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--victim-rank", type=int, default=1, help="0 where only one rank runs")
    parser.add_argument("--gpu", action="store_true", help="as bench.recovery.raysgd_kill's")


def state_bytes(workload) -> int:
    """Bytes of the model's parameters and their Adam state (as ``bench.tax.copy_probe``
    counts them, less Adam's one-number step counts), without allocating the state."""
    model = workload.model()
    return ADAM_TENSORS * sum(p.numel() * p.element_size() for p in model.parameters())


def _one_call(trainer: TorchTrainer, step_dir: str, start: int, steps: int, victim: int
              ) -> Dict[str, Any]:
    """One ``train()`` with rank ``victim`` (its process now: the step log's pid file) killed
    three quarters in; what it cost."""
    killer = Killer(step_dir, start + max(1, 3 * steps // 4), lambda: read_pid(step_dir, victim),
                    final_step=start + steps)
    killer.start()
    with PeakMemory(os.getpid(), pss=True) as peak:
        trainer.train()
    killer.join(timeout=1)
    out: Dict[str, Any] = {"killed_at_step": killer.step_at_kill, "kill_error": killer.error,
                           "peak_pss_mib": peak.pss_mib, "peak_rss_mib": peak.mib,
                           "after_pss_mib": tree_pss(os.getpid()) / MIB,
                           "commit_interval": trainer.recovery_stats.commit_interval}
    if killer.kill_time is not None:
        out.update(analyse(read_log(step_dir), killer.kill_time, read_setups(step_dir)))
    return out


def main() -> None:
    args, _, workload, steps_per_epoch, _ = start_kill_run(__doc__, _extra)
    state = state_bytes(workload)
    step_dir = tempfile.mkdtemp(prefix="bench-tax-kills-")
    ray.init(num_cpus=args.num_workers * args.threads, include_dashboard=False)
    calls: List[Dict[str, Any]] = []
    try:
        strategy = raysgd.FSDP(units=nn.Linear) if args.strategy == "fsdp" else "ddp"
        trainer = TorchTrainer(training_operator_cls=StepLogOperator, num_workers=args.num_workers,
                               num_cpus_per_worker=args.threads, strategy=strategy,
                               **gpu_settings(args), config={BATCH_SIZE: workload.batch_size, "workload": args.workload,
                                       "mode": RECOVERY_MODE, "step_dir": step_dir})
        trainer.train()  # warm-up: every commit buffer made once
        for call in range(1, args.kills + 1):
            calls.append(_one_call(trainer, step_dir, call * steps_per_epoch, steps_per_epoch,
                                   args.victim_rank))
        stats = trainer.recovery_stats
        spares = len(trainer._supervisor.group.spares)  # the bench reads what the default kept
        trainer.shutdown()
    finally:
        ray.shutdown()
        shutil.rmtree(step_dir, ignore_errors=True)
    emit({"strategy": args.strategy, "state_bytes": state, "calls": calls, "spares": spares,
          "failures": stats.failures, "recoveries": stats.recoveries, **summary(calls, state)})


def summary(calls: List[Dict[str, Any]], state: int) -> Dict[str, Any]:
    """The run's figures from its calls: the peak's growth from the first kill's call to the
    last's ÷ the state; the kill that redid the most steps (with its call's interval); the
    median seconds from a kill to the next step."""
    # A sampler can miss a short peak; the tree right after the call is a floor for it.
    peaks = [max(call["peak_pss_mib"], call["after_pss_mib"]) for call in calls]
    timed = [call for call in calls if call.get("steps_rerun") is not None]
    worst = max(timed, key=lambda call: call["steps_rerun"], default={})
    return {"growth_over_state": (peaks[-1] - peaks[0]) * MIB / state if len(peaks) > 1 else None,
            "steps_rerun_per_call": [call.get("steps_rerun") for call in calls],
            "steps_rerun": worst.get("steps_rerun"),
            "commit_interval": worst.get("commit_interval"),
            "killed_at_step": worst.get("killed_at_step"),
            "recovery_s": statistics.median(c["recovery_s"] for c in timed) if timed else None}


if __name__ == "__main__":
    main()
