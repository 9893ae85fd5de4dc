"""A chaos run's Ray driver, in a process of its own (``bench.chaos.runners.RayDriverRunner``).

``python -m bench.chaos.driver --trainer raysgd|raytrain --address A --status FILE ...``
imports what the run's process had imported before its window (torch, Ray), prints
``ready`` and waits for a line on stdin: the window's start. Then it joins the cluster
and trains until it is killed, writing ``{"error", "reported"}`` to ``--status`` (atomically)
after each ``train()`` and when training ends early.

Why a process of its own: a Ray driver whose node is killed under it may end its process
with exit code 1 (Ray's core worker gives up on a lost local raylet or plasma store). The
run's process kills the cluster once the figures are out, so it must not be that driver:
its exit code is the run's verdict. It also keeps the injector's timing free of the
driver's Python work (one GIL).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from dataclasses import asdict
from typing import Any, Callable, Dict

READY = "ready"


def _parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.driver", description=__doc__)
    parser.add_argument("--trainer", choices=("raysgd", "raytrain"), required=True)
    parser.add_argument("--address", required=True, help="the cluster's GCS address")
    parser.add_argument("--status", required=True, help="JSON file: error and reported")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--step-dir", required=True)
    parser.add_argument("--storage", required=True)
    parser.add_argument("--every", type=int, required=True)
    return parser.parse_args(argv)


class Status:
    """What the run's process reads of this driver: ``error`` and ``reported``."""

    def __init__(self, path: str):
        self.path = path
        self.state: Dict[str, Any] = {"error": None, "reported": {}}

    def set(self, **changes: Any) -> None:
        self.state.update(changes)
        tmp = self.path + ".tmp"
        with open(tmp, "w") as out:
            json.dump(self.state, out)
        os.replace(tmp, self.path)


def read_status(path: str) -> Dict[str, Any]:
    """The driver's last status; an empty one before it wrote any."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {"error": None, "reported": {}}


def train_raysgd(args: argparse.Namespace, status: Status) -> None:
    """raysgd defaults plus ``checkpoint_dir``; ``train()`` until the window ends."""
    from raysgd import TorchTrainer
    from raysgd.utils import BATCH_SIZE

    from bench.chaos.operator import ChaosOperator
    from bench.workloads import get_workload

    workload = get_workload(args.workload, args.mode)
    trainer = TorchTrainer(training_operator_cls=ChaosOperator, num_workers=2, use_gpu=False,
                           checkpoint_dir=args.storage,
                           config={BATCH_SIZE: workload.batch_size, "mode": args.mode,
                                   "workload": args.workload, "step_dir": args.step_dir})
    while True:
        trainer.train()
        status.set(reported=asdict(trainer.recovery_stats))


def train_raytrain(args: argparse.Namespace, status: Status) -> None:
    """Ray Train 2.x with ``FailureConfig(max_failures=-1)`` and ``storage_path``."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from bench.chaos.raytrain_loop import train_loop_per_worker

    config = {"workload": args.workload, "mode": args.mode, "threads": args.threads,
              "step_dir": args.step_dir, "every": args.every}
    TorchTrainer(
        train_loop_per_worker, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                     resources_per_worker={"CPU": args.threads}),
        run_config=RunConfig(name="bench-chaos", storage_path=args.storage,
                             failure_config=FailureConfig(max_failures=-1))).fit()
    raise RuntimeError("Ray Train's fit() returned inside the window")


TRAINERS: Dict[str, Callable[[argparse.Namespace, Status], None]] = {
    "raysgd": train_raysgd, "raytrain": train_raytrain}


def main(argv=None) -> None:
    # Imported before the window, as the run's own process had them. Only here: the run's
    # process imports this module for READY and read_status.
    import ray
    import torch  # noqa: F401

    args = _parse(argv)
    status = Status(args.status)
    print(READY, flush=True)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nobody reads the pipe after this line
    sys.stdin.readline()  # the window starts
    try:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
        TRAINERS[args.trainer](args, status)
    except BaseException:  # noqa: BLE001 - reported as the run's trainer_error
        status.set(error=traceback.format_exc(limit=4))
        raise


if __name__ == "__main__":
    main()
