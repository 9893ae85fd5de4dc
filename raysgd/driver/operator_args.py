"""The trainer's operator argument: a TrainingOperator subclass, or legacy creator functions."""
from __future__ import annotations

import warnings
from typing import Any, Dict

from raysgd.errors import ConfigError
from raysgd.operator import TrainingOperator


def resolve_operator(training_operator_cls, creators: Dict[str, Any],
                     serialize_data_creation: bool) -> type:
    given = {k: v for k, v in creators.items() if v is not None}
    if given and training_operator_cls is not None:
        raise ConfigError(f"Pass either training_operator_cls or creator functions "
                          f"({sorted(given)}), not both.")
    if given:
        warnings.warn("TorchTrainer(model_creator=..., ...) is deprecated; subclass "
                      "TrainingOperator, or pass training_operator_cls="
                      "TrainingOperator.from_creators(...).", DeprecationWarning, stacklevel=3)
        missing = [k for k in ("model_creator", "optimizer_creator") if k not in given]
        if missing:
            raise ConfigError(f"The creator style needs {missing}; pass them or a training_operator_cls.")
        return TrainingOperator.from_creators(
            creators["model_creator"], creators["optimizer_creator"],
            data_creator=creators["data_creator"], loss_creator=creators["loss_creator"],
            scheduler_creator=creators["scheduler_creator"],
            serialize_data_creation=serialize_data_creation)
    return check_operator_cls(training_operator_cls)


def check_operator_cls(cls: Any) -> type:
    if isinstance(cls, TrainingOperator):
        raise ConfigError(f"training_operator_cls got an instance of {type(cls).__name__}; "
                          f"pass the class itself: training_operator_cls={type(cls).__name__}.")
    if not (isinstance(cls, type) and issubclass(cls, TrainingOperator)):
        raise ConfigError(f"training_operator_cls must be a subclass of raysgd.torch.TrainingOperator, "
                          f"got {cls!r}. Define `class MyOperator(TrainingOperator): def setup(self, "
                          "config): ...` and pass MyOperator.")
    if cls.setup is TrainingOperator.setup:
        raise ConfigError(f"{cls.__name__} does not override setup(self, config); register the "
                          "models, optimizers and loaders there.")
    return cls
