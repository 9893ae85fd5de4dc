"""The four trainers of a chaos run, each started the way its users start it.

``runner.start()`` returns the launch time (the window's t0) once training has been set
going in a driver process of its own (raysgd, Ray Train: ``bench.chaos.driver``) or in a
torchrun process tree; ``runner.targets`` is what the injector hits; ``runner.error`` is
whatever ended training early; ``runner.reported`` what the trainer says of its own
recoveries (raysgd's ``recovery_stats`` after its last ``train()``).
"""
from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from bench.chaos.driver import READY, read_status
from bench.chaos.targets import ProcessTargets, RayTargets
from bench.launch import REPO_ROOT


# What a run keeps of a Ray driver's log (``trainer_log`` in its JSON): raysgd's own warnings
# say which path a recovery took (a replace that failed, a restart), where the run's figures
# only time it, and the run's folder is gone afterwards.
TRAINER_LOG_LINES = 40
TRAINER_LOG_WIDTH = 400


def raysgd_lines(text: str, limit: int = TRAINER_LOG_LINES) -> List[str]:
    """The first ``limit`` of raysgd's log lines in ``text``, each cut to a width."""
    found = [line[:TRAINER_LOG_WIDTH] for line in text.splitlines() if "raysgd: " in line]
    return found[:limit]


class RayDriverRunner:
    """A Ray trainer (``bench.chaos.driver.TRAINERS``) on a cluster of its own, driven from a
    process of its own, started and importing before the window; ``start()`` lets it go."""

    def __init__(self, trainer: str, args, step_dir: str, storage: str):
        self.targets = RayTargets(step_dir)
        self.status = os.path.join(os.path.dirname(storage), "driver-status.json")
        self.log = open(os.path.join(storage, "driver.log"), "w")  # kept with --keep
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.chaos.driver", "--trainer", trainer,
             "--address", self.targets.cluster.address, "--status", self.status,
             "--workload", args.workload, "--mode", args.mode, "--threads", str(args.threads),
             "--step-dir", step_dir, "--storage", storage, "--every", str(args.every)],
            cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True)
        if self.proc.stdout.readline().strip() != READY:
            raise RuntimeError(f"bench.chaos.driver exited with {self.proc.wait()} before it "
                               f"was ready; see {self.log.name}")

    @property
    def error(self) -> Optional[str]:
        error = read_status(self.status)["error"]
        code = self.proc.poll()
        if error is None and code is not None:
            error = f"the driver exited with {code} inside the window"
        return error

    @property
    def reported(self) -> Dict[str, Any]:
        """raysgd's ``recovery_stats`` after its last ``train()``."""
        return read_status(self.status)["reported"]

    @property
    def trainer_log(self) -> List[str]:
        """raysgd's warnings in the driver's log so far (Ray Train's driver logs none)."""
        with open(self.log.name, errors="replace") as handle:
            return raysgd_lines(handle.read())

    def start(self) -> float:
        t0 = time.time()
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return t0


class TorchrunRunner:
    """``torchrun --standalone --nproc-per-node 2 --max-restarts`` over the hand-written loop."""

    trainer_log: Sequence[str] = ()  # no raysgd in it
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
    trainer_log: Sequence[str] = ()  # no raysgd in it
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


RUNNERS = {"raysgd": functools.partial(RayDriverRunner, "raysgd"),
           "raytrain": functools.partial(RayDriverRunner, "raytrain"),
           "torchrun": TorchrunRunner, "torchft": TorchftRunner}
