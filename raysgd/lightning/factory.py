"""``make_lightning_operator``: the driver-side checks of ``TrainingOperator.from_ptl`` and
the operator class they produce (pickled by value to the workers, like CreatorOperator's)."""
from __future__ import annotations

from typing import Any

from raysgd.errors import ConfigError
from raysgd.lightning import building
from raysgd.lightning.compat import check_version, find_base
from raysgd.lightning.errors import NotALightningModuleError
from raysgd.lightning.operator import LightningOperator


def check_module_class(lightning_module_cls: Any) -> type:
    """The Lightning base of ``lightning_module_cls``; raises when it is not a LightningModule class."""
    if not isinstance(lightning_module_cls, type):
        hint = (" Pass the class, not an instance: from_ptl builds one module per worker "
                "from config." if find_base(type(lightning_module_cls), "LightningModule") else "")
        raise NotALightningModuleError(
            f"TrainingOperator.from_ptl takes a LightningModule subclass (from pytorch_lightning "
            f"or lightning.pytorch); got {lightning_module_cls!r}.{hint}")
    base = find_base(lightning_module_cls, "LightningModule")
    if base is None:
        raise NotALightningModuleError(
            f"TrainingOperator.from_ptl takes a LightningModule subclass (from pytorch_lightning "
            f"or lightning.pytorch); {lightning_module_cls.__name__} is not one. Subclass "
            "pytorch_lightning.LightningModule, or use a TrainingOperator subclass for a plain "
            "torch.nn.Module.")
    check_version(base)
    return base


def check_datamodule(datamodule: Any) -> None:
    if datamodule is None:
        return
    cls = datamodule if isinstance(datamodule, type) else type(datamodule)
    if find_base(cls, "LightningDataModule") is None:
        raise ConfigError(f"from_ptl(datamodule=...) takes a LightningDataModule (instance or "
                          f"class), got {datamodule!r}.")


def make_lightning_operator(lightning_module_cls: Any, train_dataloader: Any = None,
                            val_dataloader: Any = None, datamodule: Any = None) -> type:
    """A :class:`LightningOperator` subclass for ``lightning_module_cls``.

    Loaders given here win over the datamodule's, which win over the module's
    ``train_dataloader()`` / ``val_dataloader()``.
    """
    check_module_class(lightning_module_cls)
    check_datamodule(datamodule)
    for name, loader in (("train_dataloader", train_dataloader), ("val_dataloader", val_dataloader)):
        building.check_single_loader(name, loader)
    attrs = {
        "_lightning_module_cls": lightning_module_cls,
        "_ptl_train_dataloader": building.unpack_single(train_dataloader),
        "_ptl_val_dataloader": building.unpack_single(val_dataloader),
        "_ptl_datamodule": datamodule,
        "__doc__": f"Trains {lightning_module_cls.__qualname__} (TrainingOperator.from_ptl).",
    }
    return type(f"{lightning_module_cls.__name__}Operator", (LightningOperator,), attrs)
