"""How the model's state is spread over the workers: ``TorchTrainer(strategy=...)``.

``"ddp"`` (the default, :class:`DDP`): every rank holds the whole model, gradients and
optimizer state; gradients are all-reduced (``DistributedDataParallel`` unless
``wrap_ddp=False``). :class:`FSDP`: every rank holds only its shard of the parameters,
gradients and optimizer state (torch's ``fully_shard``, FSDP2), so a model whose training
state outgrows one worker still trains. Both are frozen settings checked on the driver;
each worker turns the one it receives into a strategy object once
(``raysgd.worker.strategy.create_strategy``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple, Union

from raysgd.errors import ConfigError


@dataclass(frozen=True)
class DDP:
    """Data parallel, full state on every rank (today's and Ray 1.12's behaviour)."""

    name = "ddp"
    commit_copies = "driver"  # rank 0's full state, copied to the driver's node
    stages_disk_checkpoints = False  # the driver writes checkpoint_dir's files from commits
    # Any rank's live state can stand in for a commit after another rank died.
    survivors_hold_state = True


@dataclass(frozen=True)
class FSDP:
    """Fully sharded data parallel (``torch.distributed.fsdp.fully_shard``).

    ``units``: the submodules that become their own shard unit (gathered before their forward,
    freed after it): a class, a tuple of classes, or a function ``module -> bool``; every match
    is sharded bottom-up, then each registered model as a whole. ``None`` shards each model as
    one unit, which saves optimizer and gradient memory but gathers all parameters at once;
    name your blocks (e.g. ``units=TransformerBlock``) to bound that too.
    ``reshard_after_forward``: free gathered parameters after forward (saves memory, gathers
    again for backward). ``cpu_offload``: keep parameter shards, gradients and the optimizer
    step on the CPU. ``reduce_dtype``: gradient reduction dtype under ``use_fp16``
    (parameters are cast to the precision's dtype; fp32 reduction by default).
    ``init_weights``: for models built on the ``meta`` device in ``setup()``, called with
    each submodule after its shards are allocated (default: the submodule's own
    ``reset_parameters()``, where it has one).

    With ``checkpoint_dir``, disk checkpoints are directories in torch's DCP format that
    every rank writes its shards into (``raysgd.state.sharded_dir``); ``save()`` still
    writes the unsharded single file. ``async_checkpoints``: write them in the background
    (``dcp.async_save``: only the copy to host memory is on the training path) or in place;
    None (default) chooses by device: in the background on GPUs, in place on CPUs, where the
    write is CPU work either way and the background copy only adds to it (measured on 2
    cores, see bench/README.md).
    """

    units: Union[None, type, Tuple[type, ...], Callable[[Any], bool]] = None
    reshard_after_forward: bool = True
    cpu_offload: bool = False
    reduce_dtype: Any = None
    init_weights: Optional[Callable[[Any], None]] = None
    async_checkpoints: Optional[bool] = None

    name = "fsdp"
    commit_copies = "peers"  # each rank's shards, copied to a rank on another node
    stages_disk_checkpoints = True  # each rank writes its shards (DCP) for checkpoint_dir
    survivors_hold_state = False  # a rank's shards are its own

    def __post_init__(self):
        _check_units(self.units)
        if not isinstance(self.reshard_after_forward, bool):
            raise ConfigError(f"FSDP(reshard_after_forward=...) must be True or False, got "
                              f"{self.reshard_after_forward!r}.")
        if not isinstance(self.cpu_offload, bool):
            raise ConfigError(f"FSDP(cpu_offload=...) must be True or False, got "
                              f"{self.cpu_offload!r}.")
        if self.init_weights is not None and not callable(self.init_weights):
            raise ConfigError(f"FSDP(init_weights=...) must be a function of one module, got "
                              f"{self.init_weights!r}.")
        _check_dtype(self.reduce_dtype)
        if self.async_checkpoints not in (None, True, False):
            raise ConfigError(f"FSDP(async_checkpoints=...) must be True, False or None (by "
                              f"device), got {self.async_checkpoints!r}.")


def _check_units(units: Any) -> None:
    import torch.nn as nn

    if units is None:
        return
    classes = units if isinstance(units, tuple) else (units,)
    if all(isinstance(c, type) for c in classes):
        bad = [c.__name__ for c in classes if not issubclass(c, nn.Module)]
        if bad:
            raise ConfigError(f"FSDP(units=...) names classes that are not torch.nn.Module "
                              f"subclasses: {bad}. Pass your block classes (e.g. "
                              "units=(TransformerBlock,)) or a function module -> bool.")
        return
    if callable(units) and not isinstance(units, tuple):
        return
    raise ConfigError(f"FSDP(units=...) takes a torch.nn.Module subclass, a tuple of them or a "
                      f"function module -> bool, got {units!r}.")


def _check_dtype(dtype: Any) -> None:
    import torch

    if dtype is not None and not isinstance(dtype, torch.dtype):
        raise ConfigError(f"FSDP(reduce_dtype=...) must be a torch.dtype such as torch.float32, "
                          f"got {dtype!r}.")


Strategy = Union[DDP, FSDP]


def resolve_strategy(strategy: Any, wrap_ddp: Any, use_fp16: Any) -> Strategy:
    """``TorchTrainer(strategy=...)`` as one frozen object, or a ``ConfigError`` saying why."""
    if strategy is None or strategy == "ddp":
        return DDP()
    if strategy == "fsdp":
        strategy = FSDP()
    if not isinstance(strategy, (DDP, FSDP)):
        raise ConfigError(f"strategy={strategy!r} is not a strategy; pass 'ddp' (the default), "
                          "'fsdp' or raysgd.FSDP(...).")
    if isinstance(strategy, FSDP):
        if wrap_ddp is False:
            raise ConfigError("strategy=FSDP(...) shards the registered models itself, so "
                              "wrap_ddp=False means nothing there; drop wrap_ddp=False, or use "
                              "strategy='ddp' to keep your own gradient synchronisation.")
        if use_fp16 == "apex":
            raise ConfigError("use_fp16='apex' does not work with strategy=FSDP(...); use "
                              "use_fp16='bf16' or True (native mixed precision, which FSDP "
                              "applies to the sharded parameters).")
    return strategy


def check_strategy(strategy: Any, wrap_ddp: Any, use_fp16: Any, operator_cls: type) -> Strategy:
    """``resolve_strategy`` plus what FSDP does not combine with yet, on the driver."""
    resolved = resolve_strategy(strategy, wrap_ddp, use_fp16)
    if isinstance(resolved, FSDP):
        why = getattr(operator_cls, "cannot_shard", None)  # the operator class says why
        if why:
            raise ConfigError(f"strategy=FSDP(...) does not work with {operator_cls.__name__}: "
                              f"{why}")
    return resolved
