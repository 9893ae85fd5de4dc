"""Frozen, validated settings shared by the driver and every worker.

The trainer turns its keyword arguments into one :class:`WorkerSettings` on the
driver; validation happens in ``__post_init__`` so a bad value fails before any
actor starts. Workers receive the object as is and never re-validate.
"""
from __future__ import annotations

import importlib.util
import numbers
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Union

from raysgd.commits.interval import AUTO
from raysgd.constants import (BATCH_SIZE, SCHEDULER_STEP_BATCH, SCHEDULER_STEP_EPOCH,
                              SCHEDULER_STEP_MANUAL, env_seconds)
from raysgd.errors import ConfigError
from raysgd.state.disk_schedule import DiskSchedule
from raysgd.strategy import DDP, FSDP

SCHEDULER_STEP_FREQS = (SCHEDULER_STEP_BATCH, SCHEDULER_STEP_EPOCH, SCHEDULER_STEP_MANUAL, None)
BACKENDS = ("auto", "gloo", "nccl")
# Ray's placement group strategies. PACK (the default) keeps ranks on as few
# nodes as possible, so DDP's all-reduce stays on fast local links.
PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
FP16_MODES = (False, True, "fp16", "bf16", "apex")
# In-epoch commit interval (batches); see bench/ for its measured cost.
DEFAULT_COMMIT_EVERY = AUTO  # checkpoint_every_n_steps: chosen from what commits cost


def apex_available() -> bool:
    """True when NVIDIA Apex's ``apex.amp`` can be imported here."""
    try:
        return importlib.util.find_spec("apex.amp") is not None
    except (ImportError, ValueError):
        return False


def _check_choice(name: str, value: Any, choices: tuple) -> None:
    # ``True in (1,)`` is true in Python, so compare identity for bools.
    ok = any(value is c or (type(value) is type(c) and value == c) for c in choices)
    if not ok:
        raise ConfigError(f"{name}={value!r} is not valid; use one of {list(choices)}.")


def check_choices(scheduler_step_freq: Any, backend: Any, use_fp16: Any) -> None:
    """The enumerated trainer arguments; cheap, so checked before anything starts."""
    _check_choice("scheduler_step_freq", scheduler_step_freq, SCHEDULER_STEP_FREQS)
    _check_choice("backend", backend, BACKENDS)
    _check_choice("use_fp16", use_fp16, FP16_MODES)


REMOVED_ARGUMENTS = {
    "num_replicas": "use num_workers=N",
    "batch_size": "use config={'batch_size': N} per worker, or config={raysgd.utils.BATCH_SIZE: N} "
                  "for a global batch split across workers",
    "data_loader_args": "return a DataLoader built with those arguments from your operator's setup()",
}


def check_removed_arguments(**given: Any) -> None:
    """TorchTrainer arguments older RaySGD versions took and 1.12 already refused."""
    for name, value in given.items():
        if value is not None:
            raise ConfigError(f"TorchTrainer({name}=...) was removed before Ray 1.12; "
                              f"{REMOVED_ARGUMENTS[name]}.")


def check_placement_strategy(strategy: Any) -> str:
    _check_choice("placement_strategy", strategy, PLACEMENT_STRATEGIES)
    return strategy


def check_num_gpus_per_worker(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise ConfigError(f"num_gpus_per_worker must be a positive number (the GPUs each worker "
                          f"reserves with use_gpu), got {value!r}.")
    return float(value)


def resolve_gpu(use_gpu: Any, per_worker: Any, num_workers: int, remote: int,
                available: Any) -> bool:
    """Whether to train on GPUs; ``available()`` counts the GPUs the workers would see."""
    if use_gpu not in ("auto", True, False):
        raise ConfigError(f"use_gpu must be True, False or 'auto', got {use_gpu!r}.")
    if use_gpu is False:
        return False
    gpus = available()
    needed = remote * check_num_gpus_per_worker(per_worker) if remote else 1
    if use_gpu is True and gpus < needed:
        raise ConfigError(f"use_gpu=True needs {per_worker:g} GPU(s) per worker "
                          f"({num_workers} workers), but the cluster has {gpus:g}. Pass "
                          "use_gpu=False to train on CPUs.")
    return gpus > 0


def check_workers_per_host(workers_per_host: Any, strategy: str) -> str:
    """The placement strategy for ``num_workers_per_host``: hosts must differ (STRICT_SPREAD)."""
    if workers_per_host is None:
        return strategy
    if isinstance(workers_per_host, bool) or not isinstance(workers_per_host, numbers.Integral) \
            or workers_per_host < 1:
        raise ConfigError(f"num_workers_per_host must be an integer >= 1 or None, got "
                          f"{workers_per_host!r}.")
    if strategy not in ("PACK", "STRICT_SPREAD"):
        raise ConfigError(f"num_workers_per_host={workers_per_host} places exactly that many "
                          f"workers on each host (STRICT_SPREAD); placement_strategy="
                          f"{strategy!r} contradicts it. Pass one of the two.")
    return "STRICT_SPREAD"


def check_max_retries(max_retries: Any) -> None:
    if max_retries is not None and (isinstance(max_retries, bool) or not isinstance(
            max_retries, numbers.Integral) or max_retries < 0):
        raise ConfigError(f"max_retries must be an integer >= 0 (0 raises at the first worker "
                          f"failure) or None for failure_config's default, got {max_retries!r}.")


def default_placement_timeout_s() -> float:
    """``SGD_PLACEMENT_GROUP_TIMEOUT_S`` from the environment (the legacy knob), else 100 s."""
    return env_seconds("SGD_PLACEMENT_GROUP_TIMEOUT_S", 100.0)


def default_timeout_s() -> float:
    """``NCCL_TIMEOUT_S`` from the environment (the legacy knob), else 1800 s."""
    return env_seconds("NCCL_TIMEOUT_S", 1800.0)


@dataclass(frozen=True)
class WorkerSettings:
    """Everything a worker needs to know besides the operator and its config."""

    use_gpu: bool = False
    backend: str = "gloo"
    wrap_ddp: bool = True
    add_dist_sampler: bool = True
    use_fp16: Union[bool, str] = False
    apex_args: Optional[Mapping[str, Any]] = None
    scheduler_step_freq: Optional[str] = None
    use_tqdm: Union[bool, str] = False  # drawn on the driver (raysgd.driver.progress)
    timeout_s: float = 1800.0
    num_cpus_per_worker: float = 1
    num_gpus_per_worker: float = 1  # reserved per worker when use_gpu
    clip_grad_norm: Optional[float] = None  # the default train_batch clips to this norm
    accumulate_steps: int = 1  # the default train_batch splits each batch into this many
    strategy: Union[DDP, FSDP] = DDP()  # resolved by raysgd.strategy.resolve_strategy
    staged_disk: Optional[DiskSchedule] = None  # set by the trainer for FSDP + checkpoint_dir

    def __post_init__(self):
        check_choices(self.scheduler_step_freq, self.backend, self.use_fp16)
        if self.backend == "nccl" and not self.use_gpu:
            raise ConfigError("backend='nccl' needs GPUs; pass use_gpu=True or backend='gloo'.")
        if self.use_fp16 == "apex" and not apex_available():
            raise ConfigError(
                "use_fp16='apex' needs NVIDIA Apex (apex.amp), which is not installed. "
                "Native torch.amp is the supported path: pass use_fp16=True (fp16 + GradScaler) "
                "or use_fp16='bf16'.")
        if self.apex_args is not None and not isinstance(self.apex_args, Mapping):
            raise ConfigError(f"apex_args must be a dict, got {type(self.apex_args).__name__}.")
        if not isinstance(self.timeout_s, numbers.Real) or self.timeout_s <= 0:
            raise ConfigError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}.")
        if not isinstance(self.num_cpus_per_worker, numbers.Real) or self.num_cpus_per_worker <= 0:
            raise ConfigError(
                f"num_cpus_per_worker must be positive, got {self.num_cpus_per_worker!r}.")
        check_num_gpus_per_worker(self.num_gpus_per_worker)
        if self.clip_grad_norm is not None and (
                isinstance(self.clip_grad_norm, bool)
                or not isinstance(self.clip_grad_norm, numbers.Real) or self.clip_grad_norm <= 0):
            raise ConfigError(f"clip_grad_norm must be a positive number or None, got "
                              f"{self.clip_grad_norm!r}.")
        if isinstance(self.accumulate_steps, bool) or not isinstance(
                self.accumulate_steps, numbers.Integral) or self.accumulate_steps < 1:
            raise ConfigError(f"accumulate_steps must be an integer >= 1 (micro-batches per "
                              f"optimizer step), got {self.accumulate_steps!r}.")


@dataclass(frozen=True)
class WarmSettings:
    """Warm processes (``raysgd.driver.pool``): reuse a stopped trainer's workers, keep spares."""

    reuse: bool = True  # shutdown() hands the workers to the pool; a new group takes them
    # Warm processes (no CPU or GPU reserved while idle) for a dead rank's place. None: on
    # CPUs the group did not reserve, one per rank of the busiest node where other nodes have
    # them, else one (raysgd.driver.spare_plan).
    spares: Optional[int] = 0

    @classmethod
    def create(cls, reuse_workers: Any, spare_workers: Any, remote_workers: int,
               in_trial: bool = False) -> "WarmSettings":
        if not isinstance(reuse_workers, bool):
            raise ConfigError(f"reuse_workers must be True or False, got {reuse_workers!r}.")
        if spare_workers is None:
            # A Tune trial retries itself (max_failures), and a spare per trial would
            # multiply by the trials running; without remote workers nothing can be replaced.
            return cls(reuse_workers, None if remote_workers and not in_trial else 0)
        if isinstance(spare_workers, bool) or not isinstance(spare_workers, numbers.Integral) \
                or spare_workers < 0:
            raise ConfigError(f"spare_workers must be an integer >= 0 or None (one spare on a "
                              f"node with a CPU the workers did not reserve; none in Tune "
                              f"trials), got {spare_workers!r}.")
        if spare_workers and not remote_workers:
            raise ConfigError("spare_workers needs remote workers, but every rank runs in the "
                              "driver (use_local=True, num_workers=1); pass spare_workers=0.")
        return cls(reuse_workers, int(spare_workers))


@dataclass(frozen=True)
class RankInfo:
    """Where one worker sits in the group."""

    world_rank: int = 0
    local_rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_backend(backend: str, use_gpu: bool) -> str:
    """Turn ``backend="auto"`` into gloo (CPU) or nccl (GPU)."""
    _check_choice("backend", backend, BACKENDS)
    if backend == "auto":
        return "nccl" if use_gpu else "gloo"
    return backend


def check_num_workers(num_workers: Any) -> int:
    if isinstance(num_workers, bool) or not isinstance(num_workers, numbers.Integral) or num_workers < 1:
        raise ConfigError(
            f"num_workers must be an integer >= 1, got {num_workers!r}. "
            "Use num_workers=1 (optionally with use_local=True) to debug in one process.")
    return int(num_workers)


def check_commit_every(every: Any) -> Union[int, str, None]:
    if every is not None and every != AUTO and (
            isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1):
        raise ConfigError(f"checkpoint_every_n_steps must be \"auto\" (chosen from what commits "
                          "cost), a positive integer or None (commit only at train() "
                          f"boundaries), got {every!r}.")
    return every


def check_num_steps(num_steps: Any) -> None:
    if num_steps is not None and (isinstance(num_steps, bool) or not isinstance(
            num_steps, numbers.Integral) or num_steps < 1):
        raise ConfigError(f"num_steps must be a positive integer or None, got {num_steps!r}.")


@dataclass(frozen=True)
class BatchSplit:
    """How a global ``BATCH_SIZE`` is divided among workers."""

    global_batch: int
    num_workers: int
    per_worker: int = field(init=False)

    def __post_init__(self):
        if not isinstance(self.global_batch, numbers.Integral) or self.global_batch < 1:
            raise ConfigError(f"config[BATCH_SIZE] must be a positive integer, got {self.global_batch!r}.")
        per = self.global_batch // self.num_workers
        if per < 1:
            raise ConfigError(
                f"config[BATCH_SIZE]={self.global_batch} is smaller than num_workers={self.num_workers}; "
                "every worker needs at least one sample per batch.")
        object.__setattr__(self, "per_worker", per)

    @property
    def divides(self) -> bool:
        return self.per_worker * self.num_workers == self.global_batch

    @property
    def effective_global(self) -> int:
        return self.per_worker * self.num_workers


def check_global_batch(config: dict, num_workers: int) -> Optional[int]:
    """``config[BATCH_SIZE]``, the global batch, rounded down (with a warning) to a multiple
    of ``num_workers``; None when the config has none."""
    if BATCH_SIZE not in config:
        return None
    split = BatchSplit(config[BATCH_SIZE], num_workers)
    if not split.divides:
        warnings.warn(f"config[BATCH_SIZE]={split.global_batch} is not divisible by "
                      f"num_workers={num_workers}; using {split.per_worker} per worker, "
                      f"a global batch of {split.effective_global}.", stacklevel=4)
        config[BATCH_SIZE] = split.effective_global
    return config[BATCH_SIZE]
