"""``LightningOperator``: a TrainingOperator whose model, optimizers, schedulers, data and
steps come from a ``LightningModule`` (Lightning 2.x, or 1.6-1.9 through
:mod:`raysgd.lightning.v1`). Built by ``TrainingOperator.from_ptl``.

The registered model is the LightningModule itself, so checkpoints, snapshots,
``trainer.get_model()`` and ``get_model()`` carry the module's own state_dict
keys. What DDP wraps is a thin :class:`~raysgd.lightning.ddp.StepDispatcher`
whose forward is ``training_step`` (automatic optimization only); manual
optimization averages gradients in each ``opt.step()`` instead.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterable, List, Optional, Tuple

import torch
from torch.nn.parallel import DistributedDataParallel

from raysgd.errors import ConfigError
from raysgd.lightning import building, ddp, steps, v1
from raysgd.lightning.compat import check_version, find_base
from raysgd.lightning.logs import Logged, LoggedMeters
from raysgd.lightning.optim_config import SchedulerSpec, parse_optimizers
from raysgd.lightning.schedules import SchedulerStepper
from raysgd.lightning.session import ModuleSession
from raysgd.lightning.source import ModuleSource
from raysgd.lightning.wrapped_optimizer import OperatorOptimizer
from raysgd.operator import TrainingOperator
from raysgd.worker.metrics import BATCH_COUNT, NUM_SAMPLES, is_number, is_scalar_tensor


class LightningOperator(TrainingOperator):
    """Trains ``_lightning_module_cls``; subclass it only to change ``ddp_args``.

    ``ddp_args`` are DistributedDataParallel keywords (e.g.
    ``{"find_unused_parameters": True}`` for a module whose training_step
    leaves some parameters unused).
    """

    _lightning_module_cls: Optional[type] = None  # None for a factory
    _ptl_source: Optional[ModuleSource] = None  # how each worker gets its module
    _ptl_train_dataloader: Any = None
    _ptl_val_dataloader: Any = None
    _ptl_datamodule: Any = None
    ddp_args: Dict[str, Any] = {}
    has_validation_step = True  # read from the module at set-up
    # validate() steps ReduceLROnPlateau schedulers that watch a validation metric, so the
    # trainer commits after it: a rollback must not undo that step.
    validate_changes_state = True
    # Read by the driver (raysgd.strategy.check_strategy) before any worker starts.
    cannot_shard = ("a LightningModule's gradient averaging and parameter broadcast assume "
                    "full parameters on every rank. Use strategy='ddp', or a TrainingOperator "
                    "that registers the module.")

    # ------------------------------------------------------------------ set-up
    def setup(self, config: Dict[str, Any]) -> None:
        source = self._ptl_source or (self._lightning_module_cls and
                                      ModuleSource("class", self._lightning_module_cls))
        if source is None:
            raise ConfigError("LightningOperator is built with TrainingOperator.from_ptl("
                              "YourLightningModule); do not use it directly.")
        self.phase: Optional[str] = None  # "train" / "validate" while one runs
        self.callback_metrics: Dict[str, torch.Tensor] = {}
        self.scheduler_specs: List[SchedulerSpec] = []
        self.lightning_optimizers: List[OperatorOptimizer] = []
        self.optimization: Any = None  # steps.AUTOMATIC or steps.MANUAL, chosen in _build
        self._synced: set = set()  # optimizers whose gradients this step already averaged
        self._warned_not_plain = False
        self.datamodule = building.instantiate_datamodule(self._ptl_datamodule, config)
        module = source.build(config)
        self.lightning_major = check_version(find_base(type(module), "LightningModule"))
        if self.lightning_major == 1:
            v1.check_module(module)
        self._session = ModuleSession(self, module, lightning_1x=self.lightning_major == 1)
        self._epoch_outputs = v1.EpochOutputs(module)
        self._stepper = SchedulerStepper([], self._lr_scheduler_step, self._average)
        self.step_takes_idx = building.takes_batch_idx(module.training_step, "training_step")
        self.val_step_takes_idx = building.takes_batch_idx(module.validation_step,
                                                           "validation_step")
        with self._session.attached():
            self._build(module)

    def _build(self, module: Any) -> None:
        building.prepare_and_setup(module, self.datamodule, self.local_rank, self.world_rank)
        # Read once, after setup() and configure_model (which may still set it), and kept.
        self.optimization = steps.optimization_of(module)
        self.optimization.check_settings(self._context.settings)
        self._check_settings()
        module.to(self.device)  # Lightning builds optimizers with the module on its device
        automatic = self.optimization.automatic
        optimizers, specs = parse_optimizers(module.configure_optimizers(), automatic)
        self.register(models=module, optimizers=optimizers,
                      schedulers=[spec.scheduler for spec in specs], ddp_args=dict(self.ddp_args))
        self._ddp_syncs = isinstance(self._models[0], DistributedDataParallel)
        self.scheduler_specs = specs
        self._stepper = SchedulerStepper(specs, self._lr_scheduler_step, self._average,
                                         enabled=automatic)
        self.lightning_optimizers = [OperatorOptimizer(opt, self._optimizer_step)
                                     for opt in self._optimizers]
        for opt in self._optimizers:  # raw optimizers (use_pl_optimizer=False) average too
            ddp.average_on_step(opt, self.sync_gradients, self._forget_sync)
        train_loader, val_loader = building.loaders(module, self.datamodule,
                                                    self._ptl_train_dataloader,
                                                    self._ptl_val_dataloader)
        self.has_validation_step = building.overrides(module, "validation_step")
        if val_loader is not None and not self.has_validation_step:
            warnings.warn(f"{type(module).__name__} has a validation loader but no "
                          "validation_step; validate() is refused (Lightning skips its "
                          "validation loop).", RuntimeWarning, stacklevel=2)
            val_loader = None  # never run the base class's empty validation_step
        self.register_data(train_loader=train_loader, validation_loader=val_loader)
        building.warn_ignored(module)
        module.on_fit_start()
        module.on_train_start()

    def _check_settings(self) -> None:
        step_freq = self._context.settings.scheduler_step_freq
        if step_freq is not None:
            warnings.warn(f"scheduler_step_freq={step_freq!r} is ignored for a LightningModule: "
                          "its schedulers step by their own 'interval' and 'frequency' from "
                          "configure_optimizers().", RuntimeWarning, stacklevel=2)

    def _check_registration(self, models, optimizers, schedulers, ddp_args) -> None:
        # Lightning schedulers step by their own interval, so scheduler_step_freq
        # may be None; they are still registered, so commits and checkpoints hold them.
        super()._check_registration(models, optimizers, [], ddp_args)

    def _wrap(self, model: torch.nn.Module, ddp_args: dict) -> torch.nn.Module:
        dispatcher = ddp.StepDispatcher(model)
        if self.optimization.automatic:
            wrapped = super()._wrap(dispatcher, ddp_args)
            if wrapped is not dispatcher:
                return wrapped
        ddp.broadcast_module(model)  # what DDP's constructor would have done
        return dispatcher

    # -------------------------------------------------------------- training
    def train_epoch(self, iterator: Iterable, info: Optional[dict] = None,
                    num_steps: Optional[int] = None, epoch_idx: int = 0) -> dict:
        """One ``train()`` call: Lightning's epoch hooks around raysgd's loop over batches.

        No ``.train()`` here: Lightning leaves each submodule's mode as the module
        set it (a frozen BatchNorm in eval mode stays there), and validate()
        restores the modes it changed.
        """
        with self._session.attached() as module, self._phase("train"):
            logs = self._session.logs
            resumed = self._resume_meters is not None  # finishing a call cut short by a failure
            meters = self._meters = self._resume_meters or LoggedMeters()
            self._resume_meters = None
            if meters.outputs is None:  # commits carry them, so a resumed call has them all
                meters.outputs = self._epoch_outputs.collector("train")
            logs.begin_epoch()
            if not resumed:
                module.on_train_epoch_start()
            for index, batch in enumerate(iterator):
                batch_idx = getattr(iterator, "batch_idx", index)
                logs.begin_batch()  # values logged in the transfer hooks belong to the batch
                batch = steps.transfer(module, batch, self.device)
                if module.on_train_batch_start(batch, batch_idx) == -1:
                    logs.end_batch()  # no step ran: dropped with the batch
                    self._stepper.after_batch(batch_idx)  # Lightning counts this batch too
                    # Lightning ends the epoch without fetching more. The iterator raysgd
                    # hands the operator has no public way to end its pass, so the call's
                    # remaining batches are fetched (not trained) and dropped.
                    for _ in iterator:
                        pass
                    break
                metrics, logged, outputs = self._train_one(batch, batch_idx)
                self.global_step += 1
                self._count_batch(meters, metrics, logged)
                v1.EpochOutputs.add(meters.outputs, outputs, training=True)
            self._stepper.end_of_batches()
            returned = self._epoch_outputs.end("train", meters.outputs)  # before on_train_epoch_end
            meters.outputs = None
            module.on_train_epoch_end()
            summary = {**meters.summary(), **logs.end_epoch(), **returned}
            self._note_callback_metrics(summary)
            self._stepper.after_train(summary, can_validate=self.validation_loader is not None)
        return summary

    def train_batch(self, batch: Any, batch_info: dict) -> dict:
        """TrainingOperator's one-batch API: the step's metrics and the values it logged."""
        self._session.logs.begin_batch()
        metrics, logged, _ = self._train_one(batch, batch_info.get("batch_idx", 0))
        return {**metrics, **logged.values}

    def _train_one(self, batch: Any, batch_idx: int) -> Tuple[dict, Logged, Any]:
        """One batch (on the device, its log scope open): the step, schedulers, batch end."""
        module = self._session.module
        self._synced.clear()  # gradients averaged for a step that never came are stale
        metrics, outputs = self.optimization.run(self, batch, batch_idx)
        self._stepper.after_batch(batch_idx)
        module.on_train_batch_end(outputs, batch, batch_idx)
        logged = self._session.logs.end_batch()
        self._note_callback_metrics({**metrics, **logged.step_values()})
        self._stepper.after_batch_end(batch_idx, self.callback_metrics,
                                      float(metrics.get(NUM_SAMPLES, 1) or 1))
        return metrics, logged, outputs

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, skipped: bool) -> None:
        """What ``OperatorOptimizer.step`` does after running the closure."""
        if skipped and self.optimization.automatic:  # training_step returned None: no step
            return
        module = self._session.module
        self.sync_gradients(optimizer)
        self.unscale_(optimizer)  # hooks and clipping see true gradients (fp16)
        module.on_before_optimizer_step(optimizer)
        self.optimization.clip(module, optimizer, self._context.settings.clip_grad_norm)
        self.step(optimizer)
        self._forget_sync(optimizer)  # also when an fp16 overflow skipped optimizer.step()

    def sync_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average ``optimizer``'s gradients over the workers, once per step, unless DDP did.

        ``clip_gradients``, the wrapper's ``step`` and the optimizer's own step hook
        all call it; after the first call of a step the others are no-ops.
        """
        if self._ddp_syncs or id(optimizer) in self._synced:
            return
        ddp.average_gradients(ddp.optimizer_params(optimizer))
        self._synced.add(id(optimizer))

    def _forget_sync(self, optimizer: torch.optim.Optimizer) -> None:
        self._synced.discard(id(optimizer))

    # ------------------------------------------------------------ validation
    def validate(self, val_iterator: Iterable, info: Optional[dict] = None) -> dict:
        """One ``validate()`` call with Lightning's validation hooks, in its order."""
        if not self.has_validation_step:  # the runner refuses first; this guards direct calls
            raise ConfigError(self.missing_validation_message)
        with self._session.attached() as module, self._phase("validate"):
            logs, meters = self._session.logs, LoggedMeters()
            outputs = self._epoch_outputs.collector("validate")
            logs.begin_epoch()
            modes = _training_modes(self._models[0])  # Lightning's _ModuleMode.capture
            module.on_validation_model_eval()
            module.on_validation_start()
            module.on_validation_epoch_start()
            with torch.no_grad():
                for batch_idx, batch in enumerate(val_iterator):
                    logs.begin_batch()
                    batch = steps.transfer(module, batch, self.device)
                    metrics, output = steps.validation_step(self, batch, batch_idx)
                    self._count_batch(meters, metrics, logs.end_batch())
                    v1.EpochOutputs.add(outputs, output, training=False)
            returned = self._epoch_outputs.end("validate", outputs)  # before on_validation_epoch_end
            module.on_validation_epoch_end()
            summary = {**meters.summary(), **logs.end_epoch(), **returned}
            module.on_validation_end()
            if building.overrides(module, "on_validation_model_train"):
                module.on_validation_model_train()
            else:  # Lightning calls the hook only when overridden; else it restores the modes
                _restore_modes(self._models[0], modes)
            self._note_callback_metrics(summary)
            self._stepper.after_validate(summary)
        return summary

    def validate_batch(self, batch: Any, batch_info: dict) -> dict:
        """TrainingOperator's one-batch API: ``validation_step``'s metrics and logged values."""
        logs = self._session.logs
        logs.begin_batch()
        metrics, _ = steps.validation_step(self, batch, batch_info.get("batch_idx", 0))
        return {**metrics, **logs.end_batch().values}

    # ----------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, Any]:
        """The module's ``on_save_checkpoint`` dict plus the schedulers' epoch counters."""
        with self._session.attached() as module:
            checkpoint: Dict[str, Any] = {"epoch": self.current_epoch,
                                          "global_step": self.global_step}
            module.on_save_checkpoint(checkpoint)
            if self.datamodule is not None:
                checkpoint["datamodule"] = self.datamodule.state_dict()
        odd = None if self._warned_not_plain else _not_plain(checkpoint, "checkpoint")
        if odd is not None:  # commits carry it fine; trainer.load's torch.load(weights_only) won't
            self._warned_not_plain = True
            warnings.warn(f"on_save_checkpoint stored {odd}, which trainer.load(path) cannot read "
                          "back (it loads tensors, numbers, strings and lists/dicts of them "
                          "only); store plain values, e.g. a state_dict().", RuntimeWarning,
                          stacklevel=2)
        return {"lightning_checkpoint": checkpoint, "schedules": self._stepper.state_dict()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._stepper.load_state_dict(state.get("schedules", {}))
        checkpoint = dict(state.get("lightning_checkpoint", {}))
        with self._session.attached() as module:
            if self.datamodule is not None and checkpoint.get("datamodule"):
                self.datamodule.load_state_dict(checkpoint["datamodule"])
            module.on_load_checkpoint(checkpoint)

    # ------------------------------------------------------------- helpers
    def get_model(self) -> torch.nn.Module:
        """The LightningModule itself (not wrapped in DDP), as Ray 1.12's operator returned."""
        return self._original_models[0] if self._original_models else self._session.module

    @property
    def missing_validation_message(self) -> str:
        """Why ``validate()`` cannot run (the runner's message when no loader is registered)."""
        name = type(self._session.module).__name__
        if not self.has_validation_step:
            return (f"No validation_step() method defined to run validate() (Lightning: "
                    f"\"No `validation_step()` method defined to run `Trainer.validate`\"): "
                    f"define validation_step(self, batch, batch_idx) in {name}, and a "
                    "val_dataloader() (or from_ptl(val_dataloader=...) or a datamodule's).")
        return (f"{name} defines validation_step but no validation data: define "
                f"val_dataloader() in it, or pass from_ptl(val_dataloader=...) or a datamodule "
                "with val_dataloader().")

    def _lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        # Looked up at each call: while attached, a 1.x module's hook has 2.x's signature.
        self._session.module.lr_scheduler_step(scheduler, metric)

    @property
    def current_epoch(self) -> int:
        """``train()`` calls finished: Lightning's 0-based index of the running epoch."""
        return self._stepper.epochs_done

    @contextlib.contextmanager
    def _phase(self, name: str):
        previous, self.phase = self.phase, name
        try:
            yield
        finally:
            self.phase = previous

    def _average(self, value: Optional[float], weight: float) -> Optional[float]:
        return ddp.average_value(value, weight, self.device)

    def _count_batch(self, meters: LoggedMeters, metrics: dict, logged: Logged) -> None:
        """One batch into the call's meters: step metrics by the batch's samples, each
        logged value by its own ``batch_size=`` (else the batch's samples)."""
        num_samples = metrics.pop(NUM_SAMPLES, 1)
        step_metrics = {k: v for k, v in metrics.items() if k not in logged.values}
        meters.update(step_metrics, n=num_samples)
        meters.add_logged(logged, num_samples)
        self._context.events.finished_batch({**step_metrics, **logged.values}, num_samples)

    def _note_callback_metrics(self, values: dict) -> None:
        # Lightning's trainer.callback_metrics: the latest value of every metric, as tensors.
        # A step's 0-d tensors are kept unread (on their device, as Lightning keeps them).
        for key, value in values.items():
            if key.startswith("last_") or key in (NUM_SAMPLES, BATCH_COUNT):
                continue
            if is_scalar_tensor(value):
                self.callback_metrics[key] = value
            elif is_number(value):
                self.callback_metrics[key] = torch.tensor(float(value))


PLAIN = (torch.Tensor, str, bytes, int, float, bool, complex, type(None), torch.dtype,
         torch.device)


def _not_plain(value: Any, where: str) -> Optional[str]:
    """Where ``value`` holds something ``torch.load(weights_only=True)`` refuses, or None."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = _not_plain(key, where) or _not_plain(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        return next((f for i, item in enumerate(value) if (f := _not_plain(item, f"{where}[{i}]"))),
                    None)
    return None if isinstance(value, PLAIN) else f"{type(value).__qualname__!r} at {where}"


def _training_modes(model: torch.nn.Module) -> Dict[str, bool]:
    return {name: sub.training for name, sub in model.named_modules()}


def _restore_modes(model: torch.nn.Module, modes: Dict[str, bool]) -> None:
    for name, sub in model.named_modules():
        if name in modes:
            sub.training = modes[name]
