"""``make_lightning_operator``: the driver-side checks of ``TrainingOperator.from_ptl`` and
the operator class they produce (pickled by value to the workers, like CreatorOperator's)."""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional, Sequence

from raysgd.errors import ConfigError
from raysgd.lightning import building
from raysgd.lightning.compat import find_base
from raysgd.lightning.operator import LightningOperator
from raysgd.lightning.source import source_of


def check_datamodule(datamodule: Any) -> None:
    if datamodule is None:
        return
    cls = datamodule if isinstance(datamodule, type) else type(datamodule)
    if find_base(cls, "LightningDataModule") is None:
        raise ConfigError(f"from_ptl(datamodule=...) takes a LightningDataModule (instance or "
                          f"class), got {datamodule!r}.")


def make_lightning_operator(lightning_module: Any, train_dataloader: Any = None,
                            val_dataloader: Any = None, datamodule: Any = None,
                            module_args: Sequence[Any] = (),
                            module_kwargs: Optional[Mapping[str, Any]] = None) -> type:
    """A :class:`LightningOperator` subclass training ``lightning_module``.

    ``lightning_module`` is a LightningModule class (built on every worker as
    ``cls(*module_args, **module_kwargs)``, or without them by Ray 1.12's rule:
    ``cls(config=config)``, ``cls(config)`` or ``cls()``), an instance built on the
    driver (each worker trains its own copy), or a factory called as
    ``factory(config)`` on every worker (see :mod:`raysgd.lightning.source`).
    Loaders given here win over the datamodule's, which win over the module's
    ``train_dataloader()`` / ``val_dataloader()``.
    """
    source = source_of(lightning_module, module_args, module_kwargs)
    check_datamodule(datamodule)
    for name, loader in (("train_dataloader", train_dataloader), ("val_dataloader", val_dataloader)):
        building.check_single_loader(name, loader)
    attrs = {
        "_lightning_module_cls": source.module_cls,
        "_ptl_source": source,
        "_ptl_train_dataloader": building.unpack_single(train_dataloader),
        "_ptl_val_dataloader": building.unpack_single(val_dataloader),
        "_ptl_datamodule": datamodule,
        "__doc__": f"Trains {source.name} (TrainingOperator.from_ptl, from a {source.kind}).",
    }
    name = re.sub(r"\W", "", source.name) or "LightningModule"
    return type(f"{name}Operator", (LightningOperator,), attrs)
