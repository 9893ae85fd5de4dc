"""Setting a LightningModule (and its data) up on a worker, in Lightning's ``fit`` order:
constructor (``source.py``) → ``prepare_data`` (once per node) → ``setup("fit")`` →
``configure_model`` (1.x: ``configure_sharded_model``); loaders come from ``from_ptl``'s
arguments, else the datamodule, else the module's hooks.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Optional, Tuple

import torch.distributed as dist

from raysgd.errors import ConfigError
from raysgd.lightning import v1
from raysgd.lightning.compat import find_base, is_overridden
from raysgd.lightning.source import construct  # noqa: F401 - also a datamodule's constructor

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
# Hooks of a Lightning Trainer fit that raysgd does not call, and why.
NOT_CALLED = {
    "backward": "raysgd's precision object does the backward pass (loss scaling); put extra "
                "work in on_before_backward / on_after_backward",
    "on_train_end": "raysgd has no end of training (the driver keeps calling train())",
    "on_fit_end": "raysgd has no end of training (the driver keeps calling train())",
}


def instantiate_datamodule(datamodule: Any, config: dict) -> Any:
    """A datamodule given as a class is built like the module; an instance is used as is."""
    if isinstance(datamodule, type):
        return construct(datamodule, config, fix=f"build it on the driver: "
                         f"from_ptl(..., datamodule={datamodule.__name__}(...))")
    return datamodule


def prepare_and_setup(module: Any, datamodule: Any, local_rank: int, world_rank: int) -> None:
    """``prepare_data`` on one rank per node (or rank 0), a barrier, then ``setup("fit")``."""
    per_node = getattr(module, "prepare_data_per_node", True)
    if (local_rank if per_node else world_rank) == 0:
        if datamodule is not None:
            datamodule.prepare_data()
        module.prepare_data()
    if dist.is_available() and dist.is_initialized():
        dist.barrier()  # the other ranks read what prepare_data downloaded
    if datamodule is not None:
        datamodule.setup("fit")
    module.setup("fit")
    configure_model = getattr(module, "configure_model", None)
    if callable(configure_model):
        configure_model()
    elif overrides(module, "configure_sharded_model"):  # Lightning 1.x's name for it
        module.configure_sharded_model()


def loaders(module: Any, datamodule: Any, train_loader: Any, val_loader: Any) -> Tuple[Any, Any]:
    """The train and validation loaders, by the precedence in this module's docstring."""
    module_base = find_base(type(module), "LightningModule")
    dm_base = find_base(type(datamodule), "LightningDataModule") if datamodule is not None else None
    if train_loader is None:
        train_loader = _from_hook("train_dataloader", module, module_base, datamodule, dm_base)
    if val_loader is None:
        val_loader = _from_hook("val_dataloader", module, module_base, datamodule, dm_base)
    for name, loader in (("train_dataloader", train_loader), ("val_dataloader", val_loader)):
        check_single_loader(name, loader)
    return unpack_single(train_loader), unpack_single(val_loader)


def _from_hook(hook: str, module: Any, module_base: Optional[type], datamodule: Any,
               dm_base: Optional[type]) -> Any:
    if is_overridden(hook, datamodule, dm_base):
        return getattr(datamodule, hook)()
    if is_overridden(hook, module, module_base):
        return getattr(module, hook)()
    return None


def check_single_loader(name: str, loader: Any) -> None:
    """raysgd trains on one loader and validates on one; Lightning's collections are refused."""
    if isinstance(loader, (list, tuple, dict)) and not _is_empty(loader):
        if isinstance(loader, (list, tuple)) and len(loader) == 1:
            return
        raise ConfigError(f"{name} gave a {type(loader).__name__} of loaders; raysgd trains on "
                          "one train loader and validates on one validation loader. Combine "
                          "the datasets (torch.utils.data.ConcatDataset) into one DataLoader.")
    if loader is not None and not _is_empty(loader) and not hasattr(loader, "__iter__"):
        raise ConfigError(f"{name} must be an iterable of batches (a DataLoader), got "
                          f"{type(loader).__name__}.")


def unpack_single(loader: Any) -> Any:
    """``[loader]`` → ``loader``; an empty collection (Lightning's "no loader") → None."""
    if isinstance(loader, (list, tuple, dict)) and _is_empty(loader):
        return None
    if isinstance(loader, (list, tuple)) and len(loader) == 1:
        return loader[0]
    return loader


def _is_empty(loader: Any) -> bool:
    return isinstance(loader, (list, tuple, dict)) and len(loader) == 0


def warn_ignored(module: Any) -> None:
    """Lightning features raysgd does not use, said once per worker at set-up."""
    callbacks = module.configure_callbacks() if overrides(module, "configure_callbacks") else None
    if callbacks:
        warnings.warn("configure_callbacks() is ignored: raysgd has no Lightning callbacks. Move "
                      "their work into the module's hooks, or into the driver loop around "
                      "trainer.train().", RuntimeWarning, stacklevel=3)
    for hook, why in {**NOT_CALLED, **v1.NOT_CALLED}.items():
        if overrides(module, hook):
            warnings.warn(f"{type(module).__name__}.{hook} is not called by raysgd: {why}.",
                          RuntimeWarning, stacklevel=3)


def overrides(module: Any, hook: str) -> bool:
    """Whether ``module``'s class overrides Lightning's ``hook``."""
    return is_overridden(hook, module, find_base(type(module), "LightningModule"))


def takes_batch_idx(step: Any, hook: str) -> bool:
    """Whether ``training_step``/``validation_step`` takes ``batch_idx`` (Lightning's rule)."""
    try:
        params = inspect.signature(step).parameters
    except (TypeError, ValueError):
        return True
    if "dataloader_iter" in params:
        raise ConfigError(f"{hook}(self, dataloader_iter) is not supported by raysgd; take "
                          f"(self, batch, batch_idx) instead.")
    if any(p.kind is p.VAR_POSITIONAL for p in params.values()) or "batch_idx" in params:
        return True
    return sum(p.kind in POSITIONAL for p in params.values()) >= 2
