"""Ray Tune integration: ``TorchTrainer.as_trainable`` and ``BaseTorchTrainable``.

Imported only on demand (``import raysgd`` does not import Ray Tune). A trial
reserves one placement group: a bundle for the trainable itself (the driver;
with ``use_local`` that bundle is rank 0) and one per remote worker. The
trainer inside the trial starts its workers in the trial's bundles, so Tune's
accounting and the workers agree, and worker failures are recovered inside
the trial as anywhere else.

With ``reuse_actors=True`` Tune hands a finished trial's actor, placement
group included, to the next trial that asks for the same resources;
``reset_config`` then swaps the trainer inside it (see its docstring).
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional

import ray
from ray import tune
from ray.util import get_current_placement_group

from raysgd.config import check_workers_per_host
from raysgd.driver.placement import Reservation, host_bundles
from raysgd.errors import ConfigError
from raysgd.trainer import TorchTrainer
from raysgd.worker.returns import name_of, wrong_return

# Trainer arguments a trial's config may set (they shape the trial's resources).
RESOURCE_KEYS = ("num_workers", "num_cpus_per_worker", "num_gpus_per_worker", "use_gpu",
                 "use_local")
CHECKPOINT_FILE = "raysgd_checkpoint.pt"
CONFIG_FILE = "trial_config.json"
DRIVER_BUNDLE = {"CPU": 1.0}

logger = logging.getLogger("raysgd")


def _check_override(fn: Optional[Callable]) -> None:
    if fn is None:
        return
    if not callable(fn):
        raise ConfigError(f"override_tune_step must be a function (trainer, info), got {fn!r}.")
    params = [p for p in inspect.signature(fn).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(params) != 2 or len(inspect.signature(fn).parameters) != 2:
        raise ConfigError("override_tune_step must take exactly two parameters, (trainer, info); "
                          f"{getattr(fn, '__name__', fn)} takes {inspect.signature(fn)}.")


def _merge_results(train: Dict[str, Any], val: Dict[str, Any]) -> Dict[str, Any]:
    """train() and validate() metrics in one dict; clashing validation keys get ``val_``."""
    merged = dict(train)
    for key, value in val.items():
        merged[key if key not in train else f"val_{key}"] = value
    return merged


class BaseTorchTrainable(tune.Trainable):
    """A Tune ``Trainable`` running one :class:`TorchTrainer` per trial.

    Made by :meth:`TorchTrainer.as_trainable`; ``step()`` is one ``train()``
    plus one ``validate()`` (or your ``override_tune_step(trainer, info)``).
    """

    _trainer_cls = TorchTrainer
    _trainer_args: tuple = ()
    _trainer_kwargs: Dict[str, Any] = {}
    _override: Optional[Callable] = None

    # --------------------------------------------------------- resources
    @classmethod
    def _settings(cls, config: Dict[str, Any]) -> Dict[str, Any]:
        """Resource-shaping arguments: the trial config first, then as_trainable's kwargs."""
        settings = {key: cls._trainer_kwargs[key] for key in RESOURCE_KEYS
                    if key in cls._trainer_kwargs}
        settings.update({key: config[key] for key in RESOURCE_KEYS if key in config})
        settings.setdefault("num_workers", 1)
        settings.setdefault("num_cpus_per_worker", 1)
        settings.setdefault("num_gpus_per_worker", 1)
        settings.setdefault("use_local", False)
        if settings.get("use_gpu", "auto") == "auto":  # legacy crashed when it was absent
            remote = settings["num_workers"] - (1 if settings["use_local"] else 0)
            gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
            settings["use_gpu"] = gpus >= max(remote, 1) * settings["num_gpus_per_worker"]
        return settings

    @classmethod
    def default_resource_request(cls, config: Dict[str, Any]) -> tune.PlacementGroupFactory:
        settings = cls._settings(config)
        worker = {"CPU": float(settings["num_cpus_per_worker"])}
        if settings["use_gpu"]:
            worker["GPU"] = float(settings["num_gpus_per_worker"])
        remote = settings["num_workers"] - (1 if settings["use_local"] else 0)
        head = dict(worker) if settings["use_local"] else dict(DRIVER_BUNDLE)
        per_host = cls._trainer_kwargs.get("num_workers_per_host")
        strategy = check_workers_per_host(per_host,
                                          cls._trainer_kwargs.get("placement_strategy", "PACK"))
        return tune.PlacementGroupFactory([head] + host_bundles(worker, remote, per_host),
                                          strategy=strategy)

    # ------------------------------------------------------------ trial
    def setup(self, config: Dict[str, Any]) -> None:
        self._start_trial(config)

    def _start_trial(self, config: Dict[str, Any]) -> None:
        self._trial_config = config
        # The request this actor's placement group was made for (reset_config checks it).
        self._held_request = type(self).default_resource_request(config)
        self._trainer = self._create_trainer(config)

    def reset_config(self, new_config: Dict[str, Any]) -> bool:
        """Run the next trial on this actor (Tune's ``reuse_actors=True``).

        Shuts this trial's trainer down and builds the new trial's the way ``setup`` does,
        in the placement group this actor already holds. Tune reuses an actor only for a
        trial whose resource request equals the finished one's; should the new config ask
        for a different placement group anyway, this returns False (Tune then ends the
        trial with an error; it does not start a fresh actor for it).
        """
        held = getattr(self, "_held_request", None)
        wanted = type(self).default_resource_request(new_config)
        if held is not None and wanted != held:
            logger.warning("raysgd: cannot run a trial that asks for %s on a Tune actor "
                           "holding %s; run it with reuse_actors=False.", wanted, held)
            return False
        trainer, self._trainer = getattr(self, "_trainer", None), None
        self._trial_config = None
        if trainer is not None:
            trainer.shutdown()  # its workers go back to the pool for the next trainer
        # Tune resets the iteration counters after this returns, not the last result: a
        # fresh actor has none (save() indexes a checkpoint by it).
        self._last_result = None
        self._start_trial(copy.deepcopy(new_config))  # setup() gets a copy too
        return True

    def _create_trainer(self, config: Dict[str, Any]) -> TorchTrainer:
        """The trial's trainer (Ray 1.12's hook: a direct subclass may override it)."""
        kwargs = dict(self._trainer_kwargs)
        kwargs.update(self._settings(config))
        # A copy per trial: legacy merged into a dict that every trial shared.
        trainer_config = {**dict(kwargs.pop("config", None) or {}), **config}
        group = get_current_placement_group()
        reservation = None
        if group is not None:
            reservation = Reservation(group, 1, len(group.bundle_specs) - 1)
        return self._trainer_cls(*self._trainer_args, config=trainer_config,
                                 _reservation=reservation, **kwargs)

    @property
    def trainer(self) -> TorchTrainer:
        """The trial's :class:`TorchTrainer`."""
        return self._trainer

    def step(self) -> Dict[str, Any]:
        if self._override is not None:
            result = self._override(self.trainer, {"iteration": self.iteration})
            if not isinstance(result, Mapping):  # Tune would fail on it far from here
                raise wrong_return(f"override_tune_step {name_of(self._override)}",
                                   result, "a dict of metrics for Tune, e.g. trainer.train()")
            return dict(result)  # Tune asserts a dict
        train = self.trainer.train()
        if self.trainer.has_validation_loader():
            return _merge_results(train, self.trainer.validate())
        return train

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        self.trainer.save(os.path.join(checkpoint_dir, CHECKPOINT_FILE))
        with open(os.path.join(checkpoint_dir, CONFIG_FILE), "w") as handle:
            json.dump(self._trial_config, handle, default=repr, sort_keys=True)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore a trial's state; a different trial's (a PBT exploit) keeps this trial's
        optimizer hyperparameters, so the mutated ones take effect."""
        hyper = None
        if self._from_other_trial(checkpoint_dir):
            hyper = self.trainer.apply_all_operators(_optimizer_hyperparameters)
        self.trainer.load(os.path.join(checkpoint_dir, CHECKPOINT_FILE))
        if hyper is not None:
            self.trainer.apply_all_operators(lambda op: _set_hyperparameters(op, hyper[0]))

    def _from_other_trial(self, checkpoint_dir: str) -> bool:
        path = os.path.join(checkpoint_dir, CONFIG_FILE)
        if not os.path.exists(path):
            return False
        with open(path) as handle:
            saved = json.load(handle)
        mine = json.loads(json.dumps(self._trial_config, default=repr, sort_keys=True))
        return saved != mine

    def cleanup(self) -> None:
        trainer = getattr(self, "trainer", None)
        if trainer is not None:
            trainer.shutdown(force=True)  # this process ends: its workers could serve no one


def _optimizer_hyperparameters(op) -> list:
    return [[{k: v for k, v in group.items() if k != "params"} for group in opt.param_groups]
            for opt in op._optimizers]


def _set_hyperparameters(op, hyper: list) -> None:
    for opt, groups in zip(op._optimizers, hyper):
        for group, values in zip(opt.param_groups, groups):
            group.update(values)


# TorchTrainer arguments that name one run's files; a Tune experiment runs many.
RUN_DIR_KEYS = ("checkpoint_dir", "loggers")


def as_trainable(trainer_cls: type, *args, override_tune_step: Optional[Callable] = None,
                 **kwargs) -> type:
    """A :class:`BaseTorchTrainable` subclass that builds ``trainer_cls(*args, **kwargs)``
    per trial, with the trial's config merged into a copy of ``kwargs["config"]``."""
    _check_override(override_tune_step)
    for name in RUN_DIR_KEYS:
        if kwargs.get(name) is not None:
            raise ConfigError(
                f"as_trainable(..., {name}=...) is not supported: every trial would share it "
                "(and resume from each other's checkpoints). Tune checkpoints and records each "
                "trial itself (save_checkpoint, its storage_path and loggers); pass "
                f"{name} to TorchTrainer when your own script drives it.")
    if "config" in kwargs and kwargs["config"] is not None and not isinstance(kwargs["config"], dict):
        raise ConfigError(f"config must be a dict, got {type(kwargs['config']).__name__}.")
    return type("TorchTrainable", (BaseTorchTrainable,), {
        "_trainer_cls": trainer_cls, "_trainer_args": args, "_trainer_kwargs": dict(kwargs),
        "_override": staticmethod(override_tune_step) if override_tune_step else None})
