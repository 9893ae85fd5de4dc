"""Variant: Ray Train 2.x ``TorchTrainer`` (``prepare_model``, ``prepare_data_loader``).

Rank 0 writes its figures to a file in the run's temporary directory: Ray Train
2.x keeps reported metrics only together with a checkpoint, and writing one
would add work the other variants do not do.
"""
import json
import os
import shutil
import tempfile

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model

from bench.child import Figures, emit, launch_time, parse_args, set_threads
from bench.loop import run_epochs
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)


def train_loop_per_worker(config: dict) -> None:
    """The hand-written loop, made distributed by Ray Train's two helpers."""
    set_threads(config["threads"])
    workload = get_workload(config["workload"], config["mode"])
    figures = Figures(workload, t0=config["t0"])
    world = ray.train.get_context().get_world_size()
    model = prepare_model(workload.model())
    loader = prepare_data_loader(workload.loader(workload.batch_size // world))
    run_epochs(model, workload.optimizer(model), workload.criterion(), loader, figures)
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["result_file"], "w") as out:
            json.dump(figures.as_dict(), out)


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    storage = tempfile.mkdtemp(prefix="bench-raytrain-")
    result_file = os.path.join(storage, "figures.json")
    config = {"workload": args.workload, "mode": args.mode, "threads": args.threads,
              "t0": launch_time(), "result_file": result_file}
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=False,
                                         resources_per_worker={"CPU": args.threads}),
            run_config=RunConfig(name="bench", storage_path=storage))
        trainer.fit()
        with open(result_file) as figures:
            emit(json.load(figures))
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
