"""Variant: Ray Train 2.x under Ray Tune, trials one after the other; the time of ``fit()``.

Ray Train 2.x (``RAY_TRAIN_V2_ENABLED``, the default in Ray 2.60) no longer
accepts a trainer as a Tune trainable (``Tuner(TorchTrainer(...))`` fails with
"Improper 'run'"). Its Tune integration is a Tune function per trial that
builds a ``ray.train.torch.TorchTrainer`` (``ScalingConfig(num_workers=2)``)
and calls ``fit()``, with ``TuneReportCallback`` forwarding rank 0's reports
to Tune. Tune's settings are the raysgd variant's (``max_concurrent_trials=1``,
``reuse_actors=True``: the Tune function's actor is kept, Ray Train still starts
its controller and workers per trial). Every trial trains one epoch of the
hand-written loop and reports once. Each rank also reports its pid (gathered over the process group), so
the run can count the worker processes it started.
"""
import os

import ray
import ray.train
import torch.distributed as dist
from ray import tune
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model
from ray.tune.integration.ray_train import TuneReportCallback

from bench.child import emit, parse_args, set_threads
from bench.loop import train_epoch
from bench.warm import TUNE_TRIALS, TUNE_WORKLOAD_MODE
from bench.warm.tune_results import learning_rates, timed_fit
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)


def train_loop_per_worker(config: dict) -> None:
    """One epoch of the hand-written loop, then one report (rank 0's reaches Tune)."""
    set_threads(config["threads"])
    workload = get_workload(config["workload"], TUNE_WORKLOAD_MODE)
    world = ray.train.get_context().get_world_size()
    model = prepare_model(workload.model())
    loader = prepare_data_loader(workload.loader(workload.batch_size // world))
    optimizer = workload.optimizer(model)
    for group in optimizer.param_groups:
        group["lr"] = config["lr"]
    train_epoch(model, optimizer, workload.criterion(), loader)
    pids = [None] * world
    dist.all_gather_object(pids, os.getpid())
    ray.train.report({"bench_worker_pids": ",".join(str(pid) for pid in pids),
                      "bench_trainable_pid": config["trainable_pid"]})


def trial(config: dict) -> None:
    """The Tune function: one Ray Train run (the Train driver of this trial)."""
    loop_config = {"lr": config["lr"], "workload": config["workload"],
                   "threads": config["threads"], "trainable_pid": os.getpid()}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=loop_config,
        scaling_config=ScalingConfig(num_workers=config["num_workers"], use_gpu=False,
                                     resources_per_worker={"CPU": config["threads"]}),
        run_config=ray.train.RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                                       storage_path=config["storage"],
                                       callbacks=[TuneReportCallback()]))
    trainer.fit()


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    trials = TUNE_TRIALS[args.mode]

    def make_tuner(storage: str):
        return tune.Tuner(
            trial,
            param_space={"lr": tune.grid_search(learning_rates(trials)),
                         "workload": args.workload, "threads": args.threads,
                         "num_workers": args.num_workers, "storage": storage},
            tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=True),
            run_config=tune.RunConfig(name="bench-warm", storage_path=storage, verbose=0))

    emit(timed_fit(make_tuner, "bench-warm-tune-raytrain-", trials))


if __name__ == "__main__":
    main()
