"""Variant: Ray Train 2.x ``TorchTrainer`` (2 workers) on a fake 3-node cluster, its node
preempted, with Ray Train's preemption API used as its documentation shows.

The same cluster, notice and deadline as ``raysgd_preempt`` (``bench.recovery.drain``).
The train function checkpoints every epoch (``ray.train.report``), asks
``ray.train.get_preemption_info()`` after every step, and on the first notice reports a
just-in-time checkpoint and trains on; ``FailureConfig(max_failures=3)`` with
``max_preemption_failures=-1`` (the default). When the node goes at its deadline Ray
Train restarts the group and the function resumes from the newest checkpoint (the
just-in-time one), skipping the batches of the epoch it had done.
"""
import os
import shutil
import tempfile

import ray
import ray.train
import torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model

from bench.child import emit, set_threads
from bench.recovery import RECOVERY_MODE, start_kill_run
from bench.recovery.drain import Drainer, notice_figures, preempt_plan, start_cluster
from bench.recovery.raytrain_kill import STATE_FILE, load_checkpoint
from bench.recovery.steplog import StepLog, read_log
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)


def report_checkpoint(model, optimizer, rank: int, step: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        saved = None
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step}, os.path.join(directory, STATE_FILE))
            saved = Checkpoint.from_directory(directory)
        ray.train.report({"step": step}, checkpoint=saved)


def train_loop_per_worker(config: dict) -> None:
    set_threads(config["threads"])
    workload = get_workload(config["workload"], config["mode"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    log = StepLog(config["step_dir"], rank, ray.get_runtime_context().get_node_id(),
                  config["min_step_s"], config["notice_step"])
    model = workload.model()
    optimizer = workload.optimizer(model)
    step = load_checkpoint(model, optimizer).get("step", 0)
    model = prepare_model(model)
    loader = prepare_data_loader(workload.loader(workload.batch_size // world))
    criterion = workload.criterion()
    saved_on_preemption = False
    for epoch in range(step // len(loader), config["epochs"]):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        for index, (features, target) in enumerate(loader):
            if index < step - epoch * len(loader):
                continue  # done before the checkpoint this run resumed from
            optimizer.zero_grad()
            criterion(model(features), target).backward()
            optimizer.step()
            step += 1
            log.completed(step)
            if ray.train.get_preemption_info() is not None and not saved_on_preemption:
                report_checkpoint(model, optimizer, rank, step)
                saved_on_preemption = True
        report_checkpoint(model, optimizer, rank, step)


def main() -> None:
    args, t0, workload, steps_per_epoch, _ = start_kill_run(__doc__, _extra)
    epochs, deadline_s, min_step_s = preempt_plan(args.mode)
    notice_step = steps_per_epoch + steps_per_epoch // 4
    storage = tempfile.mkdtemp(prefix="bench-preempt-raytrain-")
    step_dir = os.path.join(storage, "steps")
    os.makedirs(step_dir)
    config = {"workload": args.workload, "mode": RECOVERY_MODE, "threads": args.threads,
              "step_dir": step_dir, "epochs": epochs, "min_step_s": min_step_s,
              "notice_step": notice_step}
    cluster = start_cluster()
    try:
        drainer = Drainer(cluster, step_dir, notice_step, deadline_s)
        drainer.start()
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=False,
                                         resources_per_worker={"CPU": args.threads}),
            run_config=RunConfig(name="bench-preempt", storage_path=storage,
                                 failure_config=FailureConfig(max_failures=3)))
        trainer.fit()
        drainer.join(timeout=60)
    finally:
        ray.shutdown()
        cluster.shutdown()
    records = read_log(step_dir)
    shutil.rmtree(storage, ignore_errors=True)
    figures = notice_figures(drainer, records, t0, {
        "notice_step": notice_step, "expected_final_step": epochs * steps_per_epoch,
        "deadline_s": deadline_s})
    emit(figures)


if __name__ == "__main__":
    main()
