"""The :class:`Logger` interface every experiment tracker implements,
:func:`checked_loggers`, which tells a logger from a mistake, and
:func:`flatten_config`, which turns a trainer config into flat key/value pairs.

A logger lives on the driver. The :class:`~raysgd.loggers.hub.LoggerHub` calls
``setup`` in the trainer's thread, then every other method from one background
thread, in order, so a logger needs no locking of its own.
"""
from __future__ import annotations

import numbers
import os
import types
from typing import Any, Dict, List, Mapping, Optional, Sequence

from raysgd.errors import ConfigError

MAX_VALUE_CHARS = 250
# What the hub calls on a logger that does not subclass Logger (setup is optional).
DUCK_METHODS = ("log_metrics", "log_hyperparams", "finalize")


class Logger:
    """Base class of experiment trackers; subclass it and override ``log_metrics``.

    Call order: ``setup`` once, ``log_hyperparams`` once, ``log_metrics`` after
    every ``train()`` and ``validate()``, ``finalize`` once at shutdown. A method
    that raises disables the logger for the rest of the run (with one warning);
    training goes on. Raise :class:`~raysgd.errors.ConfigError` from ``setup``
    to stop the trainer from starting instead (for bad arguments).
    """

    def setup(self, run_dir: Optional[str], resumed_step: int) -> None:
        """Open files or runs. ``run_dir`` is the trainer's ``checkpoint_dir``
        (None without one); ``resumed_step`` the global step the run resumed
        at (0 for a fresh run): records logged later than it are stale."""

    def log_hyperparams(self, config: Dict[str, Any]) -> None:
        """Record the trainer's config (nested; see :func:`flatten_config`)."""

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        """Record one flat dict of numbers at global step ``step``.

        Steps only grow, except after a resume, when they restart from
        ``resumed_step``. Records of the same epoch share one step.
        """
        raise NotImplementedError(
            f"{type(self).__name__} must override log_metrics(self, metrics, step); "
            "raysgd.loggers.Logger only provides no-op setup/log_hyperparams/finalize")

    def finalize(self) -> None:
        """Flush and close; called once at trainer shutdown."""


def path_in_run(given: Optional[str], run_dir: Optional[str], default_name: str,
                what: str) -> str:
    """A logger's own path, or ``default_name`` inside the trainer's ``checkpoint_dir``."""
    if given is not None:
        return given
    if run_dir is None:
        raise ConfigError(f"{what}, or TorchTrainer(checkpoint_dir=...) to write "
                          f"{default_name} there")
    return os.path.join(run_dir, default_name)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Flatten nested dicts into ``{"a/b": value}`` with plain values.

    bool, int, float, str and None are kept (numpy and other numeric scalars
    become int or float); anything else (functions, classes, tensors, lists)
    becomes a short text, because trackers only store plain values.
    """
    flat: Dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, prefix=name + "/"))
        else:
            flat[name] = plain_value(value)
    return flat


def plain_value(value: Any) -> Any:
    """``value`` as bool/int/float/str/None; other objects as a short text."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return short_repr(value)


def short_repr(value: Any) -> str:
    """A one-line description of ``value``, at most ``MAX_VALUE_CHARS`` long."""
    qualname = getattr(value, "__qualname__", None)
    if isinstance(qualname, str) and callable(value):
        # A function's or class's repr holds a memory address, which differs
        # in every run and makes two configs look different; the name does not.
        module = getattr(value, "__module__", None)
        if isinstance(value, types.BuiltinFunctionType) and module:
            qualname = value.__name__  # torch.relu's qualname names a private class
        text = f"{module}.{qualname}" if module else qualname
    else:
        text = " ".join(repr(value).split())
    if len(text) > MAX_VALUE_CHARS:
        text = text[:MAX_VALUE_CHARS - 3] + "..."
    return text


def is_number(value: Any) -> bool:
    """True for real numbers (numpy scalars included) but not for bools."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def checked_loggers(loggers: Optional[Sequence[Any]]) -> List[Any]:
    """``loggers`` as a list, after checking each item is a logger instance;
    a ConfigError says which item is wrong and how to fix it."""
    if loggers is None:
        return []
    if isinstance(loggers, (str, bytes, Mapping)) or not isinstance(loggers, Sequence):
        raise ConfigError(
            f"loggers={loggers!r} must be a list of loggers, e.g. loggers=[CSVLogger()]")
    for index, logger in enumerate(loggers):
        _check_logger(index, logger)
    return list(loggers)


def _check_logger(index: int, logger: Any) -> None:
    if isinstance(logger, type):
        name = logger.__name__
        raise ConfigError(f"loggers[{index}]: loggers=[{name}] got the class; "
                          f"pass an instance: {name}()")
    if isinstance(logger, Logger):
        if type(logger).log_metrics is Logger.log_metrics:
            raise ConfigError(f"loggers[{index}]: {type(logger).__name__} does not override "
                              "log_metrics(self, metrics, step); define it")
        return
    missing = [m for m in DUCK_METHODS if not callable(getattr(logger, m, None))]
    if missing:
        raise ConfigError(
            f"loggers[{index}] is {_describe(logger)}, not a logger (no callable "
            f"{', '.join(missing)}); pass instances of raysgd.loggers.Logger subclasses, "
            "e.g. loggers=[CSVLogger(), TensorBoardLogger()]")


def _describe(obj: Any) -> str:
    text = repr(obj)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} of type {type(obj).__name__}"
