"""Variant: raysgd ``TorchTrainer`` with the default operator loop.

Ray is told the machine's real core count (``--num-cpus``, default ``os.cpu_count()``), as a
node declares it: raysgd keeps its default spare only on a node with a CPU the workers did
not reserve, so declaring more CPUs than the machine has would start a spare that competes
with training for cores that do not exist.
"""
import os

import ray

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import Figures, emit, parse_args, set_threads
from bench.raysgd_operator import BenchOperator
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-local", action="store_true",
                        help="rank 0 in this process (with 1 worker: no Ray at all)")
    parser.add_argument("--spare-workers", type=int, default=None,
                        help="TorchTrainer(spare_workers=...); default: raysgd's (one spare "
                             "where a CPU is free)")
    parser.add_argument("--num-cpus", type=int, default=None,
                        help="ray.init(num_cpus=...) (default: this machine's cores, at least "
                             "the workers' CPUs)")


def train(trainer: TorchTrainer, figures: Figures) -> dict:
    """First step alone (timed), rest of the first epoch, then the steady epochs."""
    trainer.train(num_steps=1)
    figures.step_done()
    trainer.train()
    figures.steady_start()
    steady = figures.workload.epochs - 1
    metrics = []
    for _ in range(steady):
        metrics.append(trainer.train())
        figures.epoch_done()
    figures.steady_end(steady)
    return metrics[-1]


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    figures = Figures(workload)
    needs_ray = args.num_workers > (1 if args.use_local else 0)
    if needs_ray:
        needed = args.num_workers * args.threads
        ray.init(num_cpus=args.num_cpus or max(os.cpu_count() or 1, needed),
                 include_dashboard=False)
    try:
        trainer = TorchTrainer(training_operator_cls=BenchOperator, num_workers=args.num_workers,
                               use_gpu=False, use_local=args.use_local,
                               num_cpus_per_worker=args.threads,
                               spare_workers=args.spare_workers,
                               config={BATCH_SIZE: workload.batch_size,
                                       "workload": args.workload, "mode": args.mode})
        last = train(trainer, figures)
        trainer.shutdown()
    finally:
        if needs_ray:
            ray.shutdown()
    emit({**figures.as_dict(), "samples_per_epoch_reported": last.get("num_samples")})


if __name__ == "__main__":
    main()
