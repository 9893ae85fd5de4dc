"""Reading an operator's settings out of ``config``, with errors that name the key."""
from __future__ import annotations

from typing import Any, Callable, Dict

import torch

from raysgd.errors import ConfigError


def creator(config: Dict[str, Any], key: str, what: str) -> Callable:
    """``config[key]``, which must be a function; the error says what it should build."""
    fn = config.get(key)
    if not callable(fn):
        raise ConfigError(f"config[{key!r}] must be a function (config) -> {what}; got {fn!r}.")
    return fn


def optimizer(config: Dict[str, Any], params) -> torch.optim.Optimizer:
    """``config["optimizer_creator"](params, config)`` if given, else SGD with ``config["lr"]``."""
    make = config.get("optimizer_creator")
    if make is not None:
        return make(params, config)
    return torch.optim.SGD(params, lr=config.get("lr", 0.1), momentum=config.get("momentum", 0.9))


def loaders(config: Dict[str, Any]):
    """``config["data_creator"](config)`` → ``(train_loader, validation_loader or None)``."""
    made = creator(config, "data_creator", "(train_loader, validation_loader)")(config)
    if not isinstance(made, (tuple, list)) or len(made) != 2:
        raise ConfigError("config['data_creator'] must return (train_loader, validation_loader); "
                          "use None for a missing validation loader.")
    return made
