"""Variant: Ray Train 2.x ``TorchTrainer`` with ``datasets={"train": ds}``.

The same in-memory dataset as ``raysgd_raydata`` (built here on the driver);
Ray Train's default ``DataConfig`` splits it across the workers
(``streaming_split(equal=True)``). Each worker iterates
``ray.train.get_dataset_shard("train").iter_torch_batches(batch_size=global // world)``
through the model wrapped by ``prepare_model`` (DDP), with the bench's model,
optimizer and loss. Rank 0 times the epochs; every rank writes the rows it
trained on per epoch to a file in the run's temporary directory (Ray Train 2.x
keeps reported metrics only together with a checkpoint).
"""
import json
import os
import shutil
import tempfile

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

from bench.child import emit, launch_time, parse_args, set_threads
from bench.data import NUM_BLOCKS
from bench.data.common import EpochClock, quiet_ray_data, workload_dataset
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=NUM_BLOCKS,
                        help="blocks of the in-memory dataset")


def train_loop_per_worker(config: dict) -> None:
    set_threads(config["threads"])
    workload = get_workload(config["workload"], config["mode"])
    clock = EpochClock(workload, t0=config["t0"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    model = prepare_model(workload.model())
    optimizer, criterion = workload.optimizer(model), workload.criterion()
    shard = ray.train.get_dataset_shard("train")
    rows = []
    for _ in range(workload.epochs):
        model.train()
        seen = 0
        for batch in shard.iter_torch_batches(batch_size=workload.batch_size // world):
            features, target = batch["x"], batch["y"]
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(features), target)
            loss.backward()
            optimizer.step()
            seen += len(target)
        rows.append(seen)
        clock.epoch_done(seen)
    clock.steady_end()
    figures = clock.as_dict() if rank == 0 else {}
    with open(os.path.join(config["result_dir"], f"rank{rank}.json"), "w") as out:
        json.dump({**figures, "rows_per_epoch": rows}, out)


def collect(result_dir: str, world: int) -> dict:
    """Rank 0's figures; ``samples_per_epoch`` summed over the ranks' row counts."""
    ranks = []
    for rank in range(world):
        with open(os.path.join(result_dir, f"rank{rank}.json")) as handle:
            ranks.append(json.load(handle))
    figures = ranks[0]
    figures["samples_per_epoch"] = [sum(epoch) for epoch in
                                    zip(*(r["rows_per_epoch"] for r in ranks))]
    figures["rows_per_epoch_per_rank"] = [r.pop("rows_per_epoch") for r in ranks]
    return figures


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    storage = tempfile.mkdtemp(prefix="bench-raytrain-data-")
    config = {"workload": args.workload, "mode": args.mode, "threads": args.threads,
              "t0": launch_time(), "result_dir": storage}
    ray.init(address="local", num_cpus=4, include_dashboard=False)  # never a `ray start` cluster
    try:
        quiet_ray_data()
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=False,
                                         resources_per_worker={"CPU": args.threads}),
            run_config=RunConfig(name="bench-data", storage_path=storage),
            datasets={"train": workload_dataset(workload, args.blocks)})
        trainer.fit()
        emit(collect(storage, args.num_workers))
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)


if __name__ == "__main__":
    main()
