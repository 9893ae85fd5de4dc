"""Ray Train's chaos run: its documented recipe, checkpoints every N steps plus one just in
time on a preemption notice (``ray.train.get_preemption_info()`` after every step, as its
docstring shows); the driver runs it with ``FailureConfig(max_failures=-1)``."""
from __future__ import annotations

import ray
import ray.train
from ray.train.torch import prepare_data_loader, prepare_model

from bench.chaos.loop import train_steps
from bench.chaos.ranklog import ChaosLog
from bench.child import set_threads
from bench.recovery.raytrain_kill import load_checkpoint
from bench.recovery.raytrain_preempt import report_checkpoint
from bench.workloads import get_workload


def train_loop_per_worker(config: dict) -> None:
    set_threads(config["threads"])
    workload = get_workload(config["workload"], config["mode"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    log = ChaosLog(config["step_dir"], ray.get_runtime_context().get_node_id())
    model = workload.model()
    optimizer = workload.optimizer(model)
    start = load_checkpoint(model, optimizer).get("step", 0)
    model = prepare_model(model)
    loader = prepare_data_loader(workload.loader(workload.batch_size // world))
    saved_on_preemption = False

    def on_step(step: int) -> None:
        nonlocal saved_on_preemption
        log.completed(rank, step)
        if step % config["every"] == 0:
            report_checkpoint(model, optimizer, rank, step)
        if ray.train.get_preemption_info() is not None and not saved_on_preemption:
            report_checkpoint(model, optimizer, rank, step)
            saved_on_preemption = True

    train_steps(model, optimizer, workload.criterion(), loader, start, on_step)
