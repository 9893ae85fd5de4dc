"""Variant: Ray Train 2.x ``TorchTrainer`` (2 workers), one worker SIGKILLed mid-epoch.

``RunConfig(failure_config=FailureConfig(max_failures=3), storage_path=<tmp>)``;
every epoch ends with ``ray.train.report(metrics, checkpoint=...)`` (rank 0 saves
model and optimizer state), and the train function restores from
``ray.train.get_checkpoint()`` when there is one, so a restart re-runs the
epoch it was killed in. Workers write their pids and rank 0 its steps to a
shared temporary directory; a driver thread kills rank 1 at the kill step, or
later if Ray Train has not yet registered the epoch-1 checkpoint by then. In
quick mode (a loaded machine, where that registration can come after the last
step) the workers wait after the first epoch's report until it is registered,
so the kill lands at the kill step. Ray Train's own settings (health-check
interval and so on) are left at their defaults.
"""
import os
import shutil
import tempfile
import time

import ray
import ray.train
import torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_data_loader, prepare_model

from bench.child import emit, set_threads
from bench.loop import train_epoch
from bench.recovery import RECOVERY_EPOCHS, RECOVERY_MODE, start_kill_run
from bench.recovery.steplog import (Killer, StepLog, analyse, read_log, read_pid,
                                     read_setups)
from bench.workloads import get_workload

STATE_FILE = "state.pt"
RUN_NAME = "bench-recovery"
# Written by Ray Train's controller once it has registered a reported checkpoint.
SNAPSHOT_FILE = "checkpoint_manager_snapshot.json"


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--max-failures", type=int, default=3)
    parser.add_argument("--victim-rank", type=int, default=1)


def load_checkpoint(model, optimizer) -> dict:
    """Load ``ray.train.get_checkpoint()`` into ``model`` and ``optimizer``; its state (the
    epoch or step it was saved at), or ``{}`` without one."""
    checkpoint = ray.train.get_checkpoint()
    if not checkpoint:
        return {}
    with checkpoint.as_directory() as directory:
        state = torch.load(os.path.join(directory, STATE_FILE))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state


def train_loop_per_worker(config: dict) -> None:
    """The hand-written loop with per-epoch checkpoints and a restore at start."""
    set_threads(config["threads"])
    workload = get_workload(config["workload"], config["mode"])
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    log = StepLog(config["step_dir"], rank)
    model = workload.model()
    optimizer = workload.optimizer(model)
    start_epoch = load_checkpoint(model, optimizer).get("epoch", 0)
    model = prepare_model(model)
    loader = prepare_data_loader(workload.loader(workload.batch_size // world))
    criterion = workload.criterion()
    step = start_epoch * len(loader)

    def on_step() -> None:
        nonlocal step
        step += 1
        log.completed(step)

    for epoch in range(start_epoch, config["epochs"]):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        train_epoch(model, optimizer, criterion, loader, on_step=on_step)
        with tempfile.TemporaryDirectory() as directory:
            saved = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                           os.path.join(directory, STATE_FILE))
                saved = Checkpoint.from_directory(directory)
            ray.train.report({"epoch": epoch + 1, "step": step}, checkpoint=saved)
        wait_until_registered(config["registered_gate"])


def wait_until_registered(path, timeout_s: float = 120.0) -> None:
    """Until ``path`` (the controller's checkpoint snapshot) exists; at once for ``None``."""
    deadline = time.monotonic() + timeout_s
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


def main() -> None:
    args, t0, workload, steps_per_epoch, target = start_kill_run(__doc__, _extra)
    final_step = RECOVERY_EPOCHS * steps_per_epoch  # the kill must come before it
    storage = tempfile.mkdtemp(prefix="bench-recovery-raytrain-")
    step_dir = os.path.join(storage, "steps")
    os.makedirs(step_dir)
    # Kill only once the epoch-1 checkpoint is registered, so the restart resumes from it
    # (the controller collects reports when it polls).
    snapshot = os.path.join(storage, RUN_NAME, SNAPSHOT_FILE)
    config = {"workload": args.workload, "mode": RECOVERY_MODE, "threads": args.threads,
              "step_dir": step_dir, "epochs": RECOVERY_EPOCHS,
              "registered_gate": snapshot if args.mode == "quick" else None}
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        killer = Killer(step_dir, target, lambda: read_pid(step_dir, args.victim_rank),
                        ready=lambda: os.path.exists(snapshot),
                        final_step=final_step)
        killer.start()
        trainer = TorchTrainer(
            train_loop_per_worker, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=False,
                                         resources_per_worker={"CPU": args.threads}),
            run_config=RunConfig(name=RUN_NAME, storage_path=storage,
                                 failure_config=FailureConfig(max_failures=args.max_failures)))
        trainer.fit()
        killer.join(timeout=1)
    finally:
        ray.shutdown()
    records, setups = read_log(step_dir), read_setups(step_dir)
    shutil.rmtree(storage, ignore_errors=True)
    figures = {"kill_step": target, "killed_at_step": killer.step_at_kill,
               "kill_error": killer.error or (None if killer.kill_time else "training ended first"),
               "commit_interval": steps_per_epoch,  # a checkpoint every epoch
               "max_failures": args.max_failures,
               "first_step_s": records[0][1] - t0 if records else None,
               "final_step": records[-1][0] if records else None,
               "expected_final_step": final_step,
               "restarts": len({pid for _, _, pid in records}) - 1}
    if killer.kill_time is not None:
        figures.update(analyse(records, killer.kill_time, setups))
    emit(figures)


if __name__ == "__main__":
    main()
