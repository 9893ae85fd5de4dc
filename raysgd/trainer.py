"""``TorchTrainer``: the driver-side facade users call.

It validates every input before a worker starts, starts the worker group,
reduces the workers' metrics and moves state between workers and files.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, List, Optional, Union

from raysgd.commits.interval import create_interval
from raysgd.config import (DEFAULT_COMMIT_EVERY, BatchSplit, WarmSettings, WorkerSettings,
                           check_choices, check_commit_every, check_max_retries,
                           check_global_batch, resolve_gpu,
                           check_num_steps, check_num_workers, check_placement_strategy,
                           check_removed_arguments, check_workers_per_host,
                           default_placement_timeout_s, default_timeout_s, resolve_backend)
from raysgd.constants import BATCH_SIZE
from raysgd.data.dataset_config import DatasetConfig, check_dataset_config, check_datasets
from raysgd.data.feed import DataFeed
from raysgd.driver import placement
from raysgd.driver.operator_args import resolve_operator
from raysgd.driver.pool import idle_timeout_s
from raysgd.driver.progress import make_progress
from raysgd.driver.recovery import RecoveryPolicy
from raysgd.driver.run_recorder import DiskSettings, ResumePoint, RunRecorder
from raysgd.driver.staged import disk_source
from raysgd.driver.supervisor import Supervisor
from raysgd.driver.worker_group import WorkerGroup
from raysgd.errors import CheckpointError, ConfigError, TrainerShutdownError
from raysgd.operator import TrainingOperator
from raysgd.recovery import FailureConfig
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.checkpoint_dir import read_checkpoint
from raysgd.storage.store import split_target
from raysgd.strategy import check_strategy
from raysgd.worker.metrics import reduce_worker_results

logger = logging.getLogger("raysgd")

class TorchTrainer:
    """Train a :class:`TrainingOperator` on ``num_workers`` processes with DDP.

    ``train()`` and ``validate()`` run one pass on every worker and return
    metrics averaged over batches and workers (weighted by samples). Worker
    failures are recovered from the last commit (see
    docs/guides/fault-tolerance.md); exceptions raised by your own code are not retried.
    """

    def __init__(self, training_operator_cls: Optional[type] = None, *,
                 initialization_hook: Optional[Callable[[], Any]] = None,
                 config: Optional[Dict[str, Any]] = None, num_workers: int = 1,
                 num_cpus_per_worker: float = 1, use_gpu: Union[bool, str] = "auto",
                 num_gpus_per_worker: float = 1,
                 backend: str = "auto", wrap_ddp: bool = True, timeout_s: Optional[float] = None,
                 use_fp16: Union[bool, str] = False, use_tqdm: Union[bool, str] = False,
                 apex_args: Optional[Dict[str, Any]] = None, add_dist_sampler: bool = True,
                 scheduler_step_freq: Optional[str] = None, use_local: bool = False,
                 checkpoint_every_n_steps: Union[int, str, None] = DEFAULT_COMMIT_EVERY,
                 min_workers: int = 1, failure_config: Optional[FailureConfig] = None,
                 clip_grad_norm: Optional[float] = None, accumulate_steps: int = 1,
                 placement_timeout_s: Optional[float] = None,
                 placement_strategy: str = "PACK", num_workers_per_host: Optional[int] = None,
                 checkpoint_dir: Optional[str] = None, keep_checkpoints: Optional[int] = 3,
                 checkpoint_every_n_steps_to_disk: Optional[int] = None, resume: bool = True,
                 checkpoint_score_attr: Optional[str] = None, checkpoint_score_mode: str = "auto",
                 storage_filesystem: Any = None, loggers: Optional[List[Any]] = None,
                 reuse_workers: bool = True, spare_workers: Optional[int] = None,
                 datasets: Optional[Dict[str, Any]] = None,
                 dataset_config: Optional[DatasetConfig] = None, strategy: Any = "ddp",
                 model_creator=None, data_creator=None, optimizer_creator=None,
                 loss_creator=None, scheduler_creator=None, serialize_data_creation: bool = True,
                 num_replicas=None, batch_size=None, data_loader_args=None,
                 _worker_group_cls: type = WorkerGroup, _reservation=None):
        check_removed_arguments(num_replicas=num_replicas, batch_size=batch_size,
                                data_loader_args=data_loader_args)
        creators = dict(model_creator=model_creator, data_creator=data_creator,
                        optimizer_creator=optimizer_creator, loss_creator=loss_creator,
                        scheduler_creator=scheduler_creator)
        self.operator_cls = resolve_operator(training_operator_cls, creators, serialize_data_creation)
        self.num_workers = check_num_workers(num_workers)
        if initialization_hook is not None and not callable(initialization_hook):
            raise ConfigError(f"initialization_hook must be a function of no arguments, got {initialization_hook!r}.")
        if config is not None and not isinstance(config, dict):
            raise ConfigError(f"config must be a dict, got {type(config).__name__}.")
        self.config = dict(config or {})
        self.use_local = bool(use_local)
        if self.use_local and placement.driver_is_ray_client():
            # Rank 0 would run on the client machine, and every worker would have to
            # open TCP connections to it (rendezvous store, gloo/NCCL) (legacy: ValueError).
            raise ConfigError("use_local setting is not supported with Ray Client: rank 0 would "
                              "run on the client machine. Use use_local=False (every rank on the "
                              "cluster; get_model() and state_dict() still reach the driver).")
        self._group_cls = _worker_group_cls
        self._reservation = _reservation  # bundles reserved by a Tune trial (raysgd.tune)
        check_choices(scheduler_step_freq, backend, use_fp16)  # before Ray starts for GPUs
        self._placement_strategy = check_workers_per_host(
            num_workers_per_host, check_placement_strategy(placement_strategy))
        self._workers_per_host = num_workers_per_host
        self._progress = make_progress(use_tqdm)
        timeout_s = default_timeout_s() if timeout_s is None else timeout_s
        remote = self.num_workers - (1 if self.use_local else 0)
        use_gpu = resolve_gpu(use_gpu, num_gpus_per_worker, self.num_workers, remote,
                              lambda: self._group_cls.cluster_gpus() if remote else _local_gpus())
        commit_every = check_commit_every(checkpoint_every_n_steps)
        strategy = check_strategy(strategy, wrap_ddp, use_fp16, self.operator_cls)
        disk = DiskSettings.create(
            checkpoint_dir, keep_checkpoints, checkpoint_every_n_steps_to_disk, resume,
            checkpoint_score_attr, checkpoint_score_mode, commit_every,
            in_process=self.use_local and self.num_workers == 1, filesystem=storage_filesystem)
        self._storage_filesystem = storage_filesystem
        self.settings = WorkerSettings(
            use_gpu=use_gpu, backend=resolve_backend(backend, use_gpu), wrap_ddp=wrap_ddp,
            add_dist_sampler=add_dist_sampler, use_fp16=use_fp16, apex_args=apex_args,
            scheduler_step_freq=scheduler_step_freq, use_tqdm=use_tqdm, timeout_s=timeout_s,
            num_cpus_per_worker=num_cpus_per_worker, num_gpus_per_worker=num_gpus_per_worker,
            clip_grad_norm=clip_grad_norm, accumulate_steps=accumulate_steps, strategy=strategy,
            staged_disk=disk.staged(strategy))
        self._warm = WarmSettings.create(
            reuse_workers, spare_workers, self.num_workers - (1 if self.use_local else 0),
            in_trial=_reservation is not None or placement.inside_placement_group())
        idle_timeout_s()  # a bad RAYSGD_IDLE_WORKER_TIMEOUT_S fails here, not at shutdown()
        failure_config = failure_config or FailureConfig(min_workers=min_workers)
        self._data = DataFeed(check_datasets(datasets), check_dataset_config(dataset_config))
        self._global_batch = check_global_batch(self.config, self.num_workers)
        self._placement_timeout_s = (default_placement_timeout_s() if placement_timeout_s is None
                                     else placement_timeout_s)
        self._initialization_hook = initialization_hook
        # An operator whose validate() changes state (a LightningModule's plateau scheduler
        # steps there) gets a commit after it, so a rollback keeps that change.
        self._validate_mutates = bool(getattr(self.operator_cls, "validate_changes_state", False))
        self._closed_reason: Optional[str] = None
        self.unwritten_checkpoints: List[int] = []  # steps the storage never took
        self._recorder = RunRecorder(disk, self.operator_cls, loggers)
        self._supervisor = Supervisor(
            self._make_group, self.num_workers, RecoveryPolicy(failure_config, self.num_workers),
            timeout_s, local_ranks=1 if self.use_local else 0, kept=self._recorder.held_commits,
            on_commit=self._recorder.commit_moved, on_driver_drain=self._recorder.save_now,
            interval=create_interval(commit_every, divides=disk.every_n_steps))
        try:
            # The checkpoint is read and checked, and the loggers set up, before any actor starts.
            self._start(self._recorder.open(self.config))
            self._recorder.start(disk_source(self.settings.staged_disk,
                                             lambda: self._supervisor.group))
        except BaseException:
            self._recorder.close()
            self._supervisor.shutdown(force=True)
            raise

    def _start(self, point: Optional[ResumePoint]) -> None:
        if point is None:
            self._supervisor.start()
            return
        try:
            self._supervisor.start((point.step, point.epoch, point.snapshots))
        except CheckpointError as exc:
            raise CheckpointError(
                f"The checkpoint {point.path} does not fit {self.operator_cls.__name__}: {exc}. "
                "Resume with the operator and models that wrote it, or start over with "
                "resume=False or another checkpoint_dir.") from exc.__cause__
        logger.warning("raysgd: resumed from %s: %d epoch(s) done, step %d", point.path,
                       point.epoch, point.step)

    # ------------------------------------------------------------- set-up
    def _make_group(self, count: int, recovering: bool):
        """A worker group of ``count`` workers; the global batch is re-split among them."""
        config = dict(self.config)
        if self._global_batch is not None:
            split = BatchSplit(self._global_batch, count)
            if not split.divides:
                logger.warning("raysgd: BATCH_SIZE %d does not divide among %d worker(s); the "
                               "global batch is %d until the group grows back",
                               split.global_batch, count, split.effective_global)
            config[BATCH_SIZE] = split.per_worker
        # Recovery should not sit out a long placement wait: a smaller group may fit.
        timeout = min(self._placement_timeout_s, 5.0) if recovering else self._placement_timeout_s
        return self._group_cls(self.operator_cls, lambda rank: dict(config), self.settings, count,
                               use_local=self.use_local, initialization_hook=self._initialization_hook,
                               placement_timeout_s=timeout, reservation=self._reservation,
                               placement_strategy=self._placement_strategy,
                               workers_per_host=self._workers_per_host, warm=self._warm,
                               data=self._data)

    # ----------------------------------------------------------- training
    def train(self, num_steps: Optional[int] = None, profile: bool = False,
              reduce_results: bool = True, max_retries: Optional[int] = None,
              info: Optional[Dict[str, Any]] = None,
              dataset: Any = None) -> Union[Dict[str, Any], List[Dict[str, Any]]]:
        """Run one pass (or ``num_steps`` batches) of training on every worker.

        Up to ``max_retries`` worker failures are recovered within this call
        (None: ``failure_config.max_retries``, 3 by default; 0 raises at once).
        An exception from your code is raised here after every worker was
        rolled back to the last commit, so the trainer stays usable.

        ``dataset`` (a ``ray.data.Dataset``, or a legacy ``raysgd.data.Dataset``) becomes
        the train input from this call on; passing the same one again continues it.
        """
        check_max_retries(max_retries)
        check_num_steps(num_steps)
        if dataset is not None:
            self._data.switch_train(dataset, lambda: self._guard(
                "train", self._supervisor.refresh_data))
        self._require("has_train_loader", "train()", "train_loader")
        return self._recorded("train", lambda: self._run_shown(
            "train", reduce_results, lambda bar: self._guard(
                "train_epoch", lambda: self._supervisor.train(num_steps, profile, info,
                                                              max_retries, progress=bar))))

    def validate(self, num_steps: Optional[int] = None, profile: bool = False,
                 reduce_results: bool = True,
                 info: Optional[Dict[str, Any]] = None) -> Union[Dict[str, Any], List[Dict[str, Any]]]:
        """Evaluate on the validation loader of every worker."""
        self._require("has_validation_loader", "validate()", "validation_loader")
        check_num_steps(num_steps)
        return self._recorded("validate", lambda: self._run_shown(
            "validate", reduce_results, lambda bar: self._call(
                "validate", num_steps, profile, info, watched=True, progress=bar,
                mutates=self._validate_mutates)))

    @property
    def epoch(self) -> int:
        """Passes over the train loader finished, counting those of a resumed run.

        A script resumes naturally with ``while trainer.epoch < N: trainer.train()``.
        """
        self._group()
        return self._supervisor.commit.epochs_done

    def update_scheduler(self, metric: Any) -> None:
        """Step every scheduler (``scheduler_step_freq="manual"``); ``metric`` feeds ReduceLROnPlateau."""
        self._call("update_scheduler", metric, mutates=True)

    def apply_all_workers(self, fn: Callable[[], Any]) -> List[Any]:
        """Run ``fn()`` in every worker process; results in rank order."""
        return self._call("apply", fn, abort_on_failure=False, mutates=True)

    def apply_all_operators(self, fn: Callable[[TrainingOperator], Any]) -> List[Any]:
        """Run ``fn(operator)`` on every worker's operator; results in rank order."""
        return self._call("apply_operator", fn, abort_on_failure=False, mutates=True)

    @property
    def recovery_stats(self):
        """Failures seen, recoveries, steps lost, recovery times, worker count, resizes."""
        return self._supervisor.stats

    # ------------------------------------------------------------- models
    def get_model(self, to_cpu: bool = False):
        """Rank 0's model(s), unwrapped from DDP (under FSDP: gathered into unsharded CPU
        copies); a list when several were registered."""
        models = self._call("get_models", to_cpu)[0]  # every rank: FSDP gathers the shards
        return models[0] if len(models) == 1 else models

    def get_local_operator(self) -> TrainingOperator:
        """The operator of rank 0 in this process (needs ``use_local=True``)."""
        if not self.use_local:
            raise ConfigError("get_local_operator() needs TorchTrainer(use_local=True); otherwise "
                              "use apply_all_operators(fn) to reach the remote operators.")
        return self._group().local_runner.operator

    # -------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, Any]:
        """Models (unwrapped, unsharded), optimizers, schedulers, epoch and operator state,
        on CPU; the same format whatever the strategy."""
        return self._call("state_dict")[0]  # every rank: FSDP gathers the shards

    def load_state_dict(self, state: Dict[str, Any], blocking: bool = False) -> None:
        """Load ``state`` into every worker. Always waits, so errors are never lost;
        ``blocking`` is accepted for compatibility."""
        # A load that fails on any rank is rolled back, so no rank keeps half of it.
        self._call("load_state_dict", self._group().put(state), abort_on_failure=False,
                   mutates=True)

    def save(self, checkpoint: str) -> str:
        """Write the state to the file ``checkpoint`` (a path or a URI such as
        ``s3://bucket/model.pt``, in ``storage_filesystem`` when given) whole or not at
        all; returns where it is."""
        store, name = split_target(checkpoint, self._storage_filesystem)
        data = checkpoint_io.to_checked_bytes(self.state_dict())
        store.write(name, data)
        path = store.child(name)
        logger.info("raysgd: checkpoint written to %s", path)
        return path

    def load(self, checkpoint: str) -> None:
        """Load a file written by :meth:`save`, or a checkpoint of ``checkpoint_dir`` (a file;
        under FSDP a sharded directory), from a path or a URI. Tensors and plain containers
        only."""
        self._group()
        self.load_state_dict(read_checkpoint(*split_target(checkpoint, self._storage_filesystem)))
        logger.info("raysgd: checkpoint %s loaded into %d worker(s)", checkpoint,
                    self._supervisor.group.num_workers)

    def restore(self, *args) -> None:
        """Removed before Ray 1.12, which raised this too; use :meth:`load`."""
        raise DeprecationWarning("TorchTrainer.restore() was removed; use TorchTrainer.load(path).")

    def shutdown(self, force: bool = False) -> None:
        """Stop the workers; every later call raises :class:`TrainerShutdownError`.

        The worker processes go back to this driver's pool, reset, for the next trainer to
        reuse (any CPU trainer; on GPUs one of the same shape; ``reuse_workers=False`` or
        ``force=True`` kills them).
        Waits for the last checkpoint to reach ``checkpoint_dir`` and closes the loggers;
        checkpoints the storage never took are named in a warning and in
        :attr:`unwritten_checkpoints` (their steps).
        """
        self.unwritten_checkpoints = self._recorder.close()
        if self._supervisor.group is not None:
            self._supervisor.shutdown(force=force)
        self._supervisor.slabs.close()  # after the disk writer: its last commit may be there
        self._closed_reason = self._closed_reason or "shutdown() was called"

    def __enter__(self) -> "TorchTrainer":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def has_validation_loader(self) -> bool:
        """Whether every worker registered a validation loader (so ``validate()`` can run)."""
        return all(caps["has_validation_loader"] for caps in self._supervisor.capabilities)

    @classmethod
    def as_trainable(cls, *args, **kwargs):
        """A Ray Tune ``Trainable`` running this trainer (see :mod:`raysgd.tune`)."""
        from raysgd.tune import as_trainable

        return as_trainable(cls, *args, **kwargs)

    # ------------------------------------------------------------ helpers
    def _group(self):
        if self._supervisor.group is None:
            raise TrainerShutdownError(
                f"This TorchTrainer has no workers ({self._closed_reason}); create a new "
                "TorchTrainer, and load a checkpoint if you saved one.")
        return self._supervisor.group

    def _require(self, capability: str, call: str, loader: str) -> None:
        self._group()
        capabilities = self._supervisor.capabilities
        missing = [rank for rank, caps in enumerate(capabilities) if not caps[capability]]
        if missing:
            slot = loader.replace("_loader", "")
            if capabilities[missing[0]].get(f"{slot}_missing"):  # the operator's own words
                raise ConfigError(capabilities[missing[0]][f"{slot}_missing"])
            raise ConfigError(f"{call} needs a {loader}, but {self.operator_cls.__name__}.setup() "
                              f"registered none on rank(s) {missing}; call "
                              f"self.register_data({loader}=...) in setup(), or pass a Ray "
                              f"dataset: TorchTrainer(datasets={{'{slot}': ds}}).")

    def _run_shown(self, desc: str, reduce_results: bool, run: Callable[[Any], List[dict]]):
        """Run a train/validate call under its progress bar (a no-op when progress is off)."""
        bar = self._progress(desc)
        try:
            results = run(bar)
        except BaseException:
            bar.close()
            raise
        done = results[0].get("batch_count") if results else None
        if not reduce_results:  # metrics the caller reduces itself: the bar shows rank 0's
            bar.close(results[0] if results else None, done)
            return results
        reduced = reduce_worker_results(results)
        bar.close(reduced, done)
        return reduced

    def _recorded(self, phase: str, run: Callable[[], Any]):
        """Run a train/validate call and hand its metrics to the run's loggers and checkpoints."""
        start = time.perf_counter()
        results = run()
        reduced = results if isinstance(results, dict) else reduce_worker_results(results)
        commit = self._supervisor.commit
        self._recorder.record(phase, reduced, commit.step, commit.epochs_done,
                              time.perf_counter() - start, commit)
        return results

    def _call(self, method: str, *args, abort_on_failure: bool = True, **options):
        self._group()
        return self._guard(method, lambda: self._supervisor.call(
            method, *args, abort_on_failure=abort_on_failure, **options))

    def _guard(self, method: str, run: Callable[[], Any]):
        """Run ``run``; the supervisor has rolled the workers back when it raises,
        unless it had to stop them (then later calls say why)."""
        self._group()
        try:
            return run()
        except BaseException as exc:
            if self._supervisor.group is None:
                self._closed_reason = (f"the workers were stopped after {type(exc).__name__} in "
                                       f"{method}; see the log")
            raise


def _local_gpus() -> float:
    import torch

    return float(torch.cuda.device_count())
