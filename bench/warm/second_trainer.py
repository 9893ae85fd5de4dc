"""Variant: two raysgd trainers one after the other in one process; the second one's start.

Trainer #1 (2 workers, the bench operator) trains one step, then a few more,
and shuts down. Trainer #2, built with the same arguments, is timed from its
constructor call to the return of its first ``train(num_steps=1)``. With
raysgd's default (``reuse_workers=True``) #1's ``shutdown()`` returns its
workers to the driver's pool and #2 takes them; ``--no-reuse`` passes
``reuse_workers=False`` to both trainers, so #2 starts its own.
"""
import os
import time

import ray

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import emit, launch_time, parse_args, set_threads
from bench.raysgd_operator import BenchOperator
from bench.workloads import get_workload

# Steps trainer #1 trains after its first one, so its workers have run a real loop.
MORE_STEPS = 4


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--no-reuse", action="store_true",
                        help="pass reuse_workers=False to both trainers")


def start(make) -> tuple:
    """``(trainer, seconds from the constructor call to the end of the first step)``."""
    begin = time.perf_counter()
    trainer = make()
    trainer.train(num_steps=1)
    return trainer, time.perf_counter() - begin


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    t0 = launch_time()
    workload = get_workload(args.workload, args.mode)
    options = {"reuse_workers": False} if args.no_reuse else {}

    def make() -> TorchTrainer:
        return TorchTrainer(training_operator_cls=BenchOperator, num_workers=args.num_workers,
                            use_gpu=False, num_cpus_per_worker=args.threads,
                            config={BATCH_SIZE: workload.batch_size, "workload": args.workload,
                                    "mode": args.mode}, **options)

    ray.init(num_cpus=4, include_dashboard=False)
    try:
        first, first_s = start(make)
        launch_first_step_s = time.time() - t0
        first.train(num_steps=MORE_STEPS)
        pids_1 = first.apply_all_workers(os.getpid)
        begin = time.perf_counter()
        first.shutdown()
        shutdown_s = time.perf_counter() - begin
        second, second_s = start(make)
        pids_2 = second.apply_all_workers(os.getpid)
        second.shutdown()
    finally:
        ray.shutdown()
    emit({"first_trainer_s": first_s, "second_trainer_s": second_s,
          "same_pids": int(sorted(pids_1) == sorted(pids_2)),
          "reused_workers": len(set(pids_1) & set(pids_2)), "shutdown_s": shutdown_s,
          "launch_first_step_s": launch_first_step_s, "pids_1": pids_1, "pids_2": pids_2,
          "reuse_workers": not args.no_reuse})


if __name__ == "__main__":
    main()
