"""The four trainers of a chaos run, each started the way its users start it.

``runner.start()`` returns the launch time (the window's t0) once training has been set
going on a thread (raysgd, Ray Train) or in a torchrun process tree; ``runner.targets``
is what the injector hits; ``runner.error`` is whatever ended training early;
``runner.reported`` what the trainer says of its own recoveries (raysgd's
``recovery_stats`` after its last ``train()``).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict
from typing import Any, Dict, Optional

from bench.chaos.targets import ProcessTargets, RayTargets
from bench.launch import REPO_ROOT


class _ThreadRunner:
    """A Ray trainer on a cluster of its own, trained on a thread of this process."""

    def __init__(self, args, step_dir: str, storage: str):
        self.args, self.step_dir, self.storage = args, step_dir, storage
        self.targets = RayTargets(step_dir)
        self.error: Optional[str] = None
        self.reported: Dict[str, Any] = {}  # what the trainer says of its own recoveries

    def start(self) -> float:
        import ray

        t0 = time.time()
        ray.init(address=self.targets.cluster.address, include_dashboard=False,
                 log_to_driver=False)
        threading.Thread(target=self._guarded, daemon=True, name="bench-chaos-train").start()
        return t0

    def _guarded(self) -> None:
        try:
            self.train()
        except BaseException:  # noqa: BLE001 - reported as the run's trainer_error
            self.error = traceback.format_exc(limit=4)

    def train(self) -> None:
        raise NotImplementedError


class RaysgdRunner(_ThreadRunner):
    """raysgd defaults plus ``checkpoint_dir``; ``train()`` until the window ends."""

    def train(self) -> None:
        from raysgd import TorchTrainer
        from raysgd.utils import BATCH_SIZE

        from bench.chaos.operator import ChaosOperator
        from bench.workloads import get_workload

        workload = get_workload(self.args.workload, self.args.mode)
        trainer = TorchTrainer(training_operator_cls=ChaosOperator, num_workers=2, use_gpu=False,
                               checkpoint_dir=self.storage,
                               config={BATCH_SIZE: workload.batch_size, "mode": self.args.mode,
                                       "workload": self.args.workload, "step_dir": self.step_dir})
        while True:
            trainer.train()
            self.reported = asdict(trainer.recovery_stats)


class RayTrainRunner(_ThreadRunner):
    """Ray Train 2.x with ``FailureConfig(max_failures=-1)`` and ``storage_path``."""

    def train(self) -> None:
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from bench.chaos.raytrain_loop import train_loop_per_worker

        config = {"workload": self.args.workload, "mode": self.args.mode,
                  "threads": self.args.threads, "step_dir": self.step_dir,
                  "every": self.args.every}
        TorchTrainer(
            train_loop_per_worker, train_loop_config=config,
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                         resources_per_worker={"CPU": self.args.threads}),
            run_config=RunConfig(name="bench-chaos", storage_path=self.storage,
                                 failure_config=FailureConfig(max_failures=-1))).fit()
        raise RuntimeError("Ray Train's fit() returned inside the window")


class TorchrunRunner:
    """``torchrun --standalone --nproc-per-node 2 --max-restarts`` over the hand-written loop."""

    MAX_RESTARTS = 1000

    def __init__(self, args, step_dir: str, storage: str):
        self.args, self.step_dir = args, step_dir
        self.checkpoint = os.path.join(storage, "state.pt")
        self.log = open(os.path.join(storage, "torchrun.log"), "w")  # kept with --keep
        self.targets = ProcessTargets(step_dir)
        self.proc: Optional[subprocess.Popen] = None
        self.reported: Dict[str, Any] = {}

    @property
    def error(self) -> Optional[str]:
        code = self.proc.poll() if self.proc else None
        return None if code is None else f"torchrun exited with {code} inside the window"

    def start(self) -> float:
        t0 = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2", "--max-restarts", str(self.MAX_RESTARTS), "-m", "bench.chaos.torchrun_loop",
             "--workload", self.args.workload, "--mode", self.args.mode,
             "--threads", str(self.args.threads), "--step-dir", self.step_dir,
             "--checkpoint", self.checkpoint, "--every", str(self.args.every)],
            cwd=REPO_ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        return t0


class TorchftRunner:
    """torchft's DDP recipe: a lighthouse and one replica group per simulated node, each a
    ``torchrun --standalone --nproc-per-node 1 --max-restarts`` of ``bench.chaos.torchft_loop``.
    Its log counts per-group batches, so a logged step is ``step_samples`` samples."""

    MAX_RESTARTS = 1000
    GROUPS = 2
    # The lighthouse's settings: a quorum every 100 ms, a dead group dropped after 1 s without
    # a heartbeat (torchft's default is 5 s; 1 s is its stall after a loss, measured here).
    LIGHTHOUSE = ("--min_replicas", "1", "--quorum_tick_ms", "100", "--join_timeout_ms",
                  "10000", "--heartbeat_timeout_ms", "1000")

    def __init__(self, args, step_dir: str, storage: str):
        from bench.workloads import get_workload

        self.args, self.step_dir = args, step_dir
        self.checkpoint = os.path.join(storage, "state.pt")
        self.log = open(os.path.join(storage, "torchft.log"), "w")  # kept with --keep
        self.targets = ProcessTargets(step_dir)
        self.procs: list = []
        self.reported: Dict[str, Any] = {}
        self.step_samples = get_workload(args.workload, args.mode).batch_size // self.GROUPS

    @property
    def error(self) -> Optional[str]:
        codes = [proc.poll() for proc in self.procs]
        gone = [code for code in codes if code is not None]
        return f"a torchft process exited with {gone[0]} inside the window" if gone else None

    def start(self) -> float:
        t0 = time.time()
        port = _free_port()
        lighthouse = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
        self.procs.append(subprocess.Popen(
            [lighthouse, *self.LIGHTHOUSE, "--bind", f"[::]:{port}"],
            stdout=self.log, stderr=subprocess.STDOUT))
        for group in range(self.GROUPS):
            # RUST_LOG: its Rust side logs every quorum and vote at INFO (15 lines a step).
            env = {"RUST_LOG": "warn", **os.environ, "REPLICA_GROUP_ID": str(group),
                   "NUM_REPLICA_GROUPS": str(self.GROUPS),
                   "TORCHFT_LIGHTHOUSE": f"http://localhost:{port}"}
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "1", "--max-restarts", str(self.MAX_RESTARTS),
                 "-m", "bench.chaos.torchft_loop", "--workload", self.args.workload,
                 "--mode", self.args.mode, "--threads", str(self.args.threads),
                 "--step-dir", self.step_dir, "--checkpoint", self.checkpoint,
                 "--every", str(self.args.every)],
                cwd=REPO_ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT))
        return t0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


RUNNERS = {"raysgd": RaysgdRunner, "raytrain": RayTrainRunner, "torchrun": TorchrunRunner,
           "torchft": TorchftRunner}
