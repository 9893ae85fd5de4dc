"""Variant: raysgd ``TorchTrainer`` (default operator loop) fed by Ray Data or a DataLoader.

``--input raydata``: the workload's arrays as an in-memory ``ray.data.Dataset``
built here on the driver, passed as ``datasets={"train": ds}`` with
``DatasetConfig(feature_columns=["x"], label_column="y")``; raysgd splits it
across the workers (``streaming_split(equal=True)``). ``--input loader``: the
main benchmark's operator (``bench/raysgd_operator.py``), which registers a
shuffling ``DataLoader`` over the same arrays; raysgd adds a
``DistributedSampler``. Either way ``config[BATCH_SIZE]`` is the global batch.

One ``trainer.train()`` per epoch, timed here on the driver: the first epoch is
warm-up (launch → its end is reported), the rest give the steady figure.

Ray is told the machine's real core count (``--num-cpus``, default ``os.cpu_count()``, at
least the workers' CPUs), as a node declares it: raysgd keeps its default spare only on a
node with a CPU the workers did not reserve.
"""
import os

import ray

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import emit, parse_args, set_threads
from bench.data import NUM_BLOCKS
from bench.data.common import EpochClock, quiet_ray_data, workload_dataset
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--input", choices=("raydata", "loader"), required=True)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--spare-workers", type=int, default=None,
                        help="TorchTrainer(spare_workers=...); default: raysgd's (one spare "
                             "where a CPU is free)")
    parser.add_argument("--num-cpus", type=int, default=None,
                        help="ray.init(num_cpus=...) (default: this machine's cores, at least "
                             "the workers' CPUs)")
    parser.add_argument("--blocks", type=int, default=NUM_BLOCKS,
                        help="blocks of the in-memory dataset (--input raydata)")


def data_options(args, workload) -> dict:
    """The operator and the trainer's data arguments for ``--input``."""
    if args.input == "loader":
        from bench.raysgd_operator import BenchOperator

        return {"training_operator_cls": BenchOperator}
    from raysgd import DatasetConfig

    from bench.data.operator import RayDataOperator

    quiet_ray_data()
    return {"training_operator_cls": RayDataOperator,
            "datasets": {"train": workload_dataset(workload, args.blocks)},
            "dataset_config": DatasetConfig(feature_columns=["x"], label_column="y")}


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    clock = EpochClock(workload)
    cpus = args.num_cpus or max(os.cpu_count() or 1, args.num_workers * args.threads)
    ray.init(address="local", num_cpus=cpus, include_dashboard=False)  # never a `ray start` one
    try:
        trainer = TorchTrainer(num_workers=args.num_workers, use_gpu=False,
                               num_cpus_per_worker=args.threads,
                               spare_workers=args.spare_workers,
                               config={BATCH_SIZE: workload.batch_size,
                                       "workload": args.workload, "mode": args.mode},
                               **data_options(args, workload))
        for _ in range(workload.epochs):
            clock.epoch_done(trainer.train().get("num_samples"))
        clock.steady_end()
        trainer.shutdown()
    finally:
        ray.shutdown()
    emit({**clock.as_dict(), "input": args.input})


if __name__ == "__main__":
    main()
