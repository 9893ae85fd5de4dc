"""Legacy creator functions (``model_creator=...``) turned into an operator class."""
from __future__ import annotations

import contextlib
import inspect
import os
import tempfile
from typing import Any, Callable, Optional

from filelock import FileLock
from torch import nn

from raysgd.errors import ConfigError
from raysgd.operator import TrainingOperator
from raysgd.worker.returns import creator_result

DATA_LOCK = os.path.join(tempfile.gettempdir(), "raysgd_data_creator.lock")


class CreatorOperator(TrainingOperator):
    """Runs the creator functions of the older RaySGD API inside ``setup``.

    Build subclasses with :meth:`TrainingOperator.from_creators`; the creators
    are class attributes, so the class pickles to workers by value.
    """

    _model_creator: Optional[Callable] = None
    _optimizer_creator: Optional[Callable] = None
    _data_creator: Optional[Callable] = None
    _loss_creator: Optional[Any] = None
    _scheduler_creator: Optional[Callable] = None
    _serialize_data_creation = True

    def setup(self, config):
        if self._model_creator is None:
            raise ConfigError("CreatorOperator is built with TrainingOperator.from_creators(...); "
                              "do not use it directly.")
        train_loader, validation_loader = self._create_data(config)
        models = self._made("model_creator", self._model_creator, config)
        optimizers = self._made("optimizer_creator", self._optimizer_creator, models, config)
        criterion = self._create_loss(config)
        kwargs = {"criterion": criterion}
        if self._scheduler_creator is not None:
            kwargs["schedulers"] = self._made("scheduler_creator", self._scheduler_creator,
                                              optimizers, config)
        self.register(models=models, optimizers=optimizers, **kwargs)
        self.register_data(train_loader=train_loader, validation_loader=validation_loader)

    def _create_data(self, config):
        if self._data_creator is None:
            return None, None
        lock = FileLock(DATA_LOCK) if self._serialize_data_creation else contextlib.nullcontext()
        with lock:
            loaders = self._made("data_creator", self._data_creator, config)
        if isinstance(loaders, (list, tuple)):  # one or two items (checked)
            return loaders[0], (loaders[1] if len(loaders) == 2 else None)
        return loaders, None

    def _create_loss(self, config):
        creator = self._loss_creator
        if creator is None:
            return None
        if inspect.isclass(creator) and issubclass(creator, nn.Module):
            return creator()  # e.g. loss_creator=nn.CrossEntropyLoss
        if isinstance(creator, nn.Module):
            return creator
        return self._made("loss_creator", creator, config)

    def _made(self, kind: str, creator: Callable, *args: Any) -> Any:
        """What ``creator`` returned, if it is what a legacy ``kind`` must return."""
        return creator_result(kind, creator(*args), creator, self)


def make_creator_operator(model_creator, optimizer_creator, data_creator=None,
                          loss_creator=None, scheduler_creator=None,
                          serialize_data_creation=True) -> type:
    for name, fn in (("model_creator", model_creator), ("optimizer_creator", optimizer_creator)):
        if not callable(fn):
            raise ConfigError(f"{name} must be a function taking config, got {fn!r}.")
    for name, fn in (("data_creator", data_creator), ("scheduler_creator", scheduler_creator)):
        if fn is not None and not callable(fn):
            raise ConfigError(f"{name} must be a function or None, got {fn!r}.")
    if loss_creator is not None and not (callable(loss_creator) or isinstance(loss_creator, nn.Module)):
        raise ConfigError(f"loss_creator must be a loss class or a function of config, got {loss_creator!r}.")
    attrs = {
        "_model_creator": staticmethod(model_creator),
        "_optimizer_creator": staticmethod(optimizer_creator),
        "_data_creator": staticmethod(data_creator) if data_creator else None,
        "_loss_creator": loss_creator if isinstance(loss_creator, nn.Module) or inspect.isclass(loss_creator)
        else (staticmethod(loss_creator) if loss_creator else None),
        "_scheduler_creator": staticmethod(scheduler_creator) if scheduler_creator else None,
        "_serialize_data_creation": serialize_data_creation,
    }
    return type("CustomCreatorOperator", (CreatorOperator,), attrs)
