"""Variant: raysgd ``TorchTrainer`` (2 workers), steady throughput at one commit interval.

The same run as ``bench.variants.raysgd_trainer`` (its ``train`` does the
timing), with ``checkpoint_every_n_steps`` set by ``--commit-every``: a number
of steps, or ``none`` for commits only at ``train()`` boundaries. No failures.
In full mode it trains ``FULL_EPOCHS`` epochs, so a few percent of cost stands
out of the run-to-run noise (the main suite's 4 epochs hold only 4 commits).
"""
import dataclasses

import ray

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import Figures, emit, parse_args, set_threads
from bench.raysgd_operator import BenchOperator
from bench.variants.raysgd_trainer import train
from bench.workloads import get_workload

FULL_EPOCHS = 12


def commit_every(value: str):
    return None if value.lower() == "none" else int(value)


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--commit-every", type=commit_every, required=True,
                        help="checkpoint_every_n_steps: a number of steps, or 'none'")


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    if args.mode == "full":
        workload = dataclasses.replace(workload, epochs=FULL_EPOCHS)
    figures = Figures(workload)
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        trainer = TorchTrainer(training_operator_cls=BenchOperator, num_workers=args.num_workers,
                               use_gpu=False, num_cpus_per_worker=args.threads,
                               checkpoint_every_n_steps=args.commit_every,
                               config={BATCH_SIZE: workload.batch_size,
                                       "workload": args.workload, "mode": args.mode})
        train(trainer, figures)
        trainer.shutdown()
    finally:
        ray.shutdown()
    emit({**figures.as_dict(), "commit_interval": args.commit_every,
          "steps_per_epoch": workload.num_samples // workload.batch_size})


if __name__ == "__main__":
    main()
