"""Variant: ``raysgd_2w`` started the way legacy scripts start Ray: a plain ``ray.init()``.

The same run as ``bench.variants.raysgd_trainer`` with 2 workers (its ``train``
does the timing), but Ray is started with its defaults: every CPU of the
machine, the dashboard when its packages are installed. The lean variant
passes the machine's cores and ``include_dashboard=False``.
"""
import ray

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import Figures, emit, parse_args, set_threads
from bench.raysgd_operator import BenchOperator
from bench.variants.raysgd_trainer import train
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    figures = Figures(workload)
    ray.init()
    try:
        trainer = TorchTrainer(training_operator_cls=BenchOperator, num_workers=args.num_workers,
                               use_gpu=False, num_cpus_per_worker=args.threads,
                               config={BATCH_SIZE: workload.batch_size,
                                       "workload": args.workload, "mode": args.mode})
        last = train(trainer, figures)
        trainer.shutdown()
    finally:
        ray.shutdown()
    emit({**figures.as_dict(), "samples_per_epoch_reported": last.get("num_samples")})


if __name__ == "__main__":
    main()
