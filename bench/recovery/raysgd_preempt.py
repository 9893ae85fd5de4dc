"""Variant: raysgd ``TorchTrainer`` (2 workers) on a fake 3-node cluster, its node preempted.

Both workers share one 2-CPU node (``bench.recovery.drain``); early in the second epoch
that node is drained for preemption with a 15 s deadline and removed at the deadline.
raysgd stops every rank at one step, moves them to the other node and resumes;
``train()`` keeps going. Defaults otherwise (the node's CPUs are all reserved, so no
spare: the ranks move into new processes).
"""
import os
import shutil
import tempfile

import ray

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import emit
from bench.recovery import RECOVERY_MODE, start_kill_run
from bench.recovery.drain import Drainer, notice_figures, preempt_plan, start_cluster
from bench.recovery.step_operator import StepLogOperator
from bench.recovery.steplog import read_log

def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)


def main() -> None:
    args, t0, workload, steps_per_epoch, _ = start_kill_run(__doc__, _extra)
    epochs, deadline_s, min_step_s = preempt_plan(args.mode)
    notice_step = steps_per_epoch + steps_per_epoch // 4
    step_dir = tempfile.mkdtemp(prefix="bench-preempt-raysgd-")
    cluster = start_cluster()
    try:
        trainer = TorchTrainer(training_operator_cls=StepLogOperator, num_workers=args.num_workers,
                               use_gpu=False, num_cpus_per_worker=args.threads,
                               config={BATCH_SIZE: workload.batch_size, "workload": args.workload,
                                       "mode": RECOVERY_MODE, "step_dir": step_dir,
                                       "min_step_s": min_step_s, "floor_after": notice_step})
        drainer = Drainer(cluster, step_dir, notice_step, deadline_s)
        drainer.start()
        for _ in range(epochs):
            trainer.train()
        drainer.join(timeout=60)
        stats = trainer.recovery_stats
        trainer.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()
    records = read_log(step_dir)
    shutil.rmtree(step_dir, ignore_errors=True)
    figures = notice_figures(drainer, records, t0, {
        "notice_step": notice_step, "expected_final_step": epochs * steps_per_epoch,
        "deadline_s": deadline_s})
    figures.update(preemptions=stats.preemptions, failures=stats.failures,
                   steps_lost_reported=stats.steps_lost,
                   handover_reported_s=(stats.handover_times_s or [None])[-1])
    emit(figures)


if __name__ == "__main__":
    main()
