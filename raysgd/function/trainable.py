"""Function trainables: a plain training function run by Ray Tune on N DDP workers.

``DistributedTrainableCreator(func, num_workers=2)`` returns a Tune ``Trainable``
class. Each trial starts a :class:`~raysgd.trainer.TorchTrainer` whose operator is
:class:`~raysgd.function.operator.FunctionOperator`, so workers are placed, joined into a
process group and recovered exactly as for operator-style training. A Tune iteration
is one report of the function (``tune.report`` / ``ray.train.report``); rank 0's
metrics are the trial's, as in Ray 1.x.

Imported only on demand: it imports Ray Tune.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional

import ray
from ray import tune
from ray.train._internal.session import _TrainingResult
from ray.tune.result import DONE, RESULT_DUPLICATE, SHOULD_CHECKPOINT
from ray.util import get_current_placement_group

from raysgd.config import check_num_gpus_per_worker, check_num_workers, check_workers_per_host
from raysgd.constants import NCCL_TIMEOUT_S
from raysgd.driver.placement import Reservation, host_bundles
from raysgd.errors import ConfigError
from raysgd.function.operator import FunctionOperator
from raysgd.function.session import checkpoint_call
from raysgd.state.dirblob import pack_dir, unpack_dir
from raysgd.trainer import TorchTrainer

logger = logging.getLogger("raysgd")


class SavedCheckpoint(_TrainingResult):
    """What ``trainable.save()`` returns: Tune's result, usable as the directory's path
    (Ray 1.x returned the path: ``os.path.join(trainable.save(), "checkpoint")``)."""

    def __init__(self, result: _TrainingResult):
        super().__init__(result.checkpoint, result.metrics)

    def __fspath__(self) -> str:
        return self.checkpoint.path


class FunctionTrainable(tune.Trainable):
    """A trial running ``_function`` on ``_num_workers`` workers (made by the creator)."""

    _function: Optional[Callable] = None
    _num_workers = 1
    _num_cpus_per_worker = 1.0
    _num_gpus_per_worker = 0.0
    _backend = "gloo"
    _timeout_s: float = NCCL_TIMEOUT_S
    _placement_strategy = "PACK"
    _num_workers_per_host: Optional[int] = None

    @classmethod
    def _worker_bundles(cls) -> List[Dict[str, float]]:
        worker = {"CPU": float(cls._num_cpus_per_worker)}
        if cls._num_gpus_per_worker:
            worker["GPU"] = cls._num_gpus_per_worker
        return host_bundles(worker, cls._num_workers, cls._num_workers_per_host)

    @classmethod
    def default_resource_request(cls, config: Dict[str, Any]) -> tune.PlacementGroupFactory:
        # The trial's own actor only waits on the workers: an empty head bundle, as in Ray 1.x.
        return tune.PlacementGroupFactory([{}] + cls._worker_bundles(),
                                          strategy=cls._placement_strategy)

    def setup(self, config: Dict[str, Any]) -> None:
        self._finished = False
        self._last_metrics: Dict[str, Any] = {}
        self._checkpoint: Optional[Any] = None  # object ref of the last packed checkpoint
        self._started = False
        self._trainer = self._new_trainer(config)

    def _new_trainer(self, config: Dict[str, Any]) -> TorchTrainer:
        group = get_current_placement_group()
        reservation = None
        if group is not None:  # under Tune: the trial's last bundles (Ray drops an empty head)
            count = len(self._worker_bundles())
            reservation = Reservation(group, len(group.bundle_specs) - count, count)
        return TorchTrainer(FunctionOperator, config=dict(config), num_workers=self._num_workers,
                            num_cpus_per_worker=self._num_cpus_per_worker,
                            use_gpu=self._num_gpus_per_worker > 0,
                            num_gpus_per_worker=self._num_gpus_per_worker or 1,
                            backend=self._backend, timeout_s=self._timeout_s,
                            placement_strategy=self._placement_strategy,
                            num_workers_per_host=self._num_workers_per_host,
                            checkpoint_every_n_steps=None, _reservation=reservation,
                            # The function runs in a thread no one can stop: its processes
                            # cannot serve another trainer, nor survive a peer's death.
                            reuse_workers=False, spare_workers=0)

    def step(self) -> Dict[str, Any]:
        if self._finished:
            raise RuntimeError("Training has already finished: the function returned. Build a "
                               "new trainable (or let Tune start a new trial) to train again.")
        func, checkpoint, trial = self._function, self._checkpoint, self._trial_context()
        self._started = True
        # Not apply_all_operators: that waits for every rank even after one died, and a
        # survivor may sit in an NCCL collective until its timeout. This call gives up on
        # the others after a grace period, and the supervisor restarts the group.
        result = self._trainer._call(
            "apply_operator", lambda op: op.next_result(func, checkpoint, trial))[0]
        if result["done"]:
            self._finished = True
            # Tune's mark for "the function returned": the trial ends on its last real
            # result, without counting an iteration (Ray 1.x did the same).
            metrics = {**self._last_metrics, RESULT_DUPLICATE: True, DONE: True}
        else:
            metrics = self._last_metrics = dict(result["metrics"])
        if result["checkpoint"] is not None:
            self._checkpoint = ray.put(result["checkpoint"])
            metrics[SHOULD_CHECKPOINT] = True
        return metrics

    def _trial_context(self) -> Dict[str, Any]:
        return {"trial_id": self.trial_id, "trial_name": self.trial_name,
                "experiment_name": getattr(self._storage, "experiment_dir_name", "default"),
                "trial_dir": self.logdir}

    def save(self, checkpoint_dir: Optional[str] = None) -> SavedCheckpoint:
        return SavedCheckpoint(super().save(checkpoint_dir))

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self._checkpoint is not None:
            unpack_dir(ray.get(self._checkpoint), checkpoint_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        blob = pack_dir(checkpoint_dir)
        self._checkpoint = ray.put(blob) if blob else None
        self._finished = False
        if self._started:
            # The function is running from its old state and a thread cannot be
            # stopped: start fresh workers, which run it again from this checkpoint.
            self._trainer.shutdown()
            self._trainer = self._new_trainer(self.config)
            self._started = False

    def cleanup(self) -> None:
        trainer = getattr(self, "_trainer", None)
        if trainer is not None:
            trainer.shutdown()


def _gpus_per_worker(use_gpu: Any, num_gpus_per_worker: Any) -> float:
    """GPUs each worker reserves: ``num_gpus_per_worker``, or 1 for Ray 0.8's ``use_gpu=True``."""
    if use_gpu not in (None, True, False):
        raise ConfigError(f"use_gpu must be True or False, got {use_gpu!r}.")
    if num_gpus_per_worker == 0:
        return 1.0 if use_gpu else 0.0
    return check_num_gpus_per_worker(num_gpus_per_worker)


def DistributedTrainableCreator(func: Callable, num_workers: int = 1,  # noqa: N802 - legacy name
                                num_cpus_per_worker: float = 1, use_gpu: Optional[bool] = None,
                                backend: str = "gloo", timeout_s: float = NCCL_TIMEOUT_S,
                                num_gpus_per_worker: int = 0,
                                num_workers_per_host: Optional[int] = None) -> type:
    """A Tune trainable class running ``func(config, checkpoint_dir=None)`` on
    ``num_workers`` processes with ``torch.distributed`` initialised (like ``torchrun``).

    ``func`` reports with ``ray.tune.report(metrics)`` (or ``ray.train.report``);
    each report is one Tune iteration, and rank 0's metrics are the trial's. Write
    checkpoints inside ``with distributed_checkpoint_dir(step) as path:`` (rank 0's
    is kept) or report one with ``checkpoint=Checkpoint.from_directory(path)``; a
    restored trial calls ``func`` with ``checkpoint_dir`` set. Resources are set by
    the class: do not pass ``resources_per_trial``.
    """
    if not callable(func):
        raise ConfigError(f"DistributedTrainableCreator needs a training function, got {func!r}.")
    checkpoint_call(func)  # raises on a signature raysgd could not call
    if backend not in ("gloo", "nccl", "auto"):
        raise ConfigError(f"backend must be 'gloo', 'nccl' or 'auto', got {backend!r}.")
    gpus = _gpus_per_worker(use_gpu, num_gpus_per_worker)
    gpu = gpus > 0
    if backend == "nccl" and not gpu:
        raise ConfigError("backend='nccl' needs GPUs; pass use_gpu=True or backend='gloo'.")
    attributes = {
        "_function": staticmethod(func), "_num_workers": check_num_workers(num_workers),
        "_num_cpus_per_worker": float(num_cpus_per_worker), "_num_gpus_per_worker": gpus,
        "_backend": ("nccl" if gpu else "gloo") if backend == "auto" else backend,
        "_timeout_s": float(timeout_s),
        "_num_workers_per_host": num_workers_per_host,
        "_placement_strategy": check_workers_per_host(num_workers_per_host, "PACK")}
    name = f"Distributed{getattr(func, '__name__', 'Function').title().replace('_', '')}"
    return type(name, (FunctionTrainable,), attributes)


__all__ = ["DistributedTrainableCreator", "FunctionTrainable", "SavedCheckpoint"]
