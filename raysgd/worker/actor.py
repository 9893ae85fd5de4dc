"""The Ray actor around one :class:`WorkerRunner`: set-up, calls and control threads.

This module imports no torch: Ray loads it to create every worker, so a spare answers
its control thread at once and does its heavy imports in :meth:`_WorkerActor.warm`.
"""
from __future__ import annotations

import gc
import importlib
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import ray

from raysgd.worker import priority
from raysgd.worker.process_start import ProcessStart

if TYPE_CHECKING:
    from raysgd.worker.process_state import Baseline
    from raysgd.worker.runner import WorkerRunner

# How long a remote rank waits at a commit for the driver to take it before
# training on regardless (it only waits that long if the driver stopped asking).
COMMIT_WAIT_S = 10.0


class _WorkerActor:
    """Thin actor around a :class:`WorkerRunner`; tags errors with the rank."""

    def __init__(self, spare: bool = False, start: ProcessStart = ProcessStart()):
        """A process a trainer started (as a rank or a ``spare``) runs as ``start`` says from
        here on, as the ranks do: at their niceness (``raysgd.worker.priority``; a newcomer or
        spare warming up beside training then competes with it as an equal, as the ranks do
        with the driver and Ray's daemons), and with huge pages for large tensors where asked
        (``raysgd.worker.huge_pages``: before anything here imports torch)."""
        self.runner: Optional[WorkerRunner] = None
        self.rank = -1
        self.baseline: Optional[Baseline] = None  # taken before any user code runs here
        self.devices: list = []  # a former spare's device ids, taken from a dead rank
        self.ray_niceness = priority.current()  # what Ray started it at; the pool's
        self.huge_pages = start.apply()
        if not spare:  # a spare takes it in warm() (torch comes with it)
            self._capture_baseline()

    def _capture_baseline(self) -> None:
        if self.baseline is None:
            from raysgd.worker.process_state import Baseline
            self.baseline = Baseline.capture()
            # What the process holds now (torch, Ray, raysgd imported) stays for its life:
            # the collector stops scanning it, so a full collection (every release()) walks
            # only what trainers made since: under a millisecond, against 0.16 s.
            gc.freeze()

    def warm(self, operator_blob: bytes) -> str:
        """A spare does now what a worker's first trainer would wait for: import torch,
        raysgd's worker side, what DDP imports on first use and the operator's module
        (``operator_blob`` is the pickled class). A spare is kept only where a CPU is free
        for it (``raysgd.driver.spare_plan``), or where the user asked for one. It
        initialises no CUDA (importing torch does not).
        Returns the node it runs on."""
        importlib.import_module("raysgd.worker.runner")  # torch and the worker modules
        self._capture_baseline()
        importlib.import_module("torch._dynamo")  # DDP's first construction does (about 1 s)
        ray.cloudpickle.loads(operator_blob)
        return ray.get_runtime_context().get_node_id()

    def use_devices(self, ids: list) -> None:
        """A spare taking a GPU rank: see the dead rank's devices (``ids``, Ray's accelerator
        ids, which the rank's bundle still reserves). Ray shows an actor holding no GPU
        none; CUDA reads this when first used, which a spare never did while warming."""
        self.devices = [str(i) for i in ids]
        self._show_devices()

    def _show_devices(self) -> None:
        if self.devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.devices)

    def node_info(self) -> Dict[str, Any]:
        return {"node_id": ray.get_runtime_context().get_node_id(),
                "host": ray.util.get_node_ip_address(), "pid": os.getpid(),
                "devices": self.devices or [str(i) for i in ray.get_gpu_ids()],
                "huge_pages": self.huge_pages}

    def start(self, init_hook, runner_kwargs: Dict[str, Any],
              niceness: Optional[int] = None) -> None:
        """Become a rank: run the hook and set up the runner, at ``niceness`` (the driver's,
        ``raysgd.worker.priority``; None keeps Ray's)."""
        self.rank = runner_kwargs["rank"].world_rank
        priority.set_niceness(niceness)
        self._capture_baseline()  # taken already unless a spare never finished warming
        # The actor reserves no CPU itself (its bundle does), so Ray set OMP_NUM_THREADS to 1;
        # say what the worker has, for libraries and user code that size thread pools by it.
        os.environ["OMP_NUM_THREADS"] = str(runner_kwargs.get("num_threads") or 1)
        if init_hook is not None:
            self.execute_fn(init_hook)
        from raysgd.worker.runner import WorkerRunner
        self.runner = WorkerRunner(**runner_kwargs)

    def release(self) -> bool:
        """Stop the runner (its process group and operator) and reset the process, so the
        next trainer finds it as a new one would be; the process stays, warm."""
        if self.runner is not None:
            self.runner.shutdown()
            self.runner = None
        self.rank = -1
        priority.set_niceness(self.ray_niceness)  # lowering a priority needs no privilege
        if self.baseline is not None:
            self.baseline.restore()
        self._show_devices()  # the baseline predates the device a former spare took
        return True

    def execute(self, method: str, *args, **kwargs) -> Any:
        return self.execute_fn(getattr(self.runner, method), *args, **kwargs)

    def execute_fn(self, fn: Callable, *args, **kwargs) -> Any:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            exc.add_note(f"[raysgd] raised on rank {self.rank} (pid {os.getpid()})")
            raise

    # Two results: a small header the driver reads and a snapshot it only
    # holds a reference to (the snapshot stays in the object store).
    @ray.method(num_returns=2)
    def execute_pair(self, method: str, *args):
        return self.execute(method, *args)

    # Control methods run in their own thread, beside a running train_epoch.
    @ray.method(concurrency_group="control")
    def progress(self) -> Dict[str, Any]:
        runner = self.runner  # release() may clear it meanwhile
        return runner.progress() if runner else {"steps": 0, "idle_s": 0.0}

    # The two-phase agreement on a step where every rank stops (raysgd.worker.stop_point):
    # "propose" / "confirm" take the step, "withdraw" none.
    @ray.method(concurrency_group="control")
    def stop_point(self, action: str, *step: int) -> Any:
        runner = self.runner  # release() may clear it meanwhile
        if runner is None:
            return {"accepted": False, "passed": -1, "ended": True} if action == "propose" \
                else False
        return getattr(runner.stop_point, action)(*step)

    # The driver's standing request for the next in-epoch commit: answered
    # the moment the training thread offers one (or None after ``wait_s``).
    @ray.method(concurrency_group="commits", num_returns=2)
    def next_commit(self, after: int, wait_s: float, ticket: int, slab=None):
        runner = self.runner  # release() may clear it meanwhile
        snap = runner.next_commit(after, wait_s, ticket, slab) if runner else None
        header = {key: snap[key] for key in ("step", "call_done", "epochs_done", "slab_version",
                                             "in_slab")} if snap else None
        return header, snap

    # A copy of another rank's commit part, stored on this node as this call's return value,
    # so the driver owns it (raysgd.driver.replicas); the second return is small, so the
    # driver learns it is done without fetching the copy. A thread of its own: a transfer
    # never delays a health check.
    @ray.method(concurrency_group="copies", num_returns=2)
    def copy_part(self, parts: list):
        return ray.get(parts[0]), True  # a list: Ray must not resolve it for the driver

    # The files this rank staged for a sharded disk checkpoint (raysgd.driver.staged); a
    # thread of their own, as they may wait for the shards' write to finish.
    @ray.method(concurrency_group="staging")
    def staged_files(self, step: int, by_path: bool = False, with_version: bool = False) -> Any:
        return self.execute_fn(self._staging_runner().staged_files, step, by_path, with_version)

    @ray.method(concurrency_group="staging")
    def staged_version(self, step: int) -> Optional[int]:
        return self.execute_fn(self._staging_runner().staged_version, step)

    @ray.method(concurrency_group="staging")
    def hold_staged(self, step: int) -> None:
        return self.execute_fn(self._staging_runner().hold_staged, step)

    def _staging_runner(self) -> Any:
        runner = self.runner  # release() may clear it meanwhile
        if runner is None:
            raise RuntimeError(f"rank {self.rank} has no runner, so no staged checkpoint")
        return runner


# Two commit threads: a request from a new call can enter while one left over
# from the previous call still waits, and releases it (see CommitHandoff.take).
RemoteWorker = ray.remote(concurrency_groups={"control": 1, "commits": 2, "copies": 1,
                                               "staging": 1})(
    _WorkerActor)
