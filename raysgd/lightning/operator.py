"""``LightningOperator``: a TrainingOperator whose model, optimizers, schedulers, data and
steps come from a Lightning 2.x ``LightningModule``. Built by ``TrainingOperator.from_ptl``.

The registered model is the LightningModule itself, so checkpoints, snapshots,
``trainer.get_model()`` and ``get_model()`` carry the module's own state_dict
keys. What DDP wraps is a thin :class:`~raysgd.lightning.ddp.StepDispatcher`
whose forward is ``training_step`` (automatic optimization only); manual
optimization averages gradients in each ``opt.step()`` instead.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterable, List, Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from raysgd.errors import ConfigError
from raysgd.lightning import building, ddp, steps
from raysgd.lightning.optim_config import SchedulerSpec, parse_optimizers
from raysgd.lightning.schedules import SchedulerStepper
from raysgd.lightning.session import ModuleSession
from raysgd.lightning.wrapped_optimizer import OperatorOptimizer
from raysgd.metrics import NUM_SAMPLES, AverageMeterCollection, is_number
from raysgd.operator import TrainingOperator


class LightningOperator(TrainingOperator):
    """Trains ``_lightning_module_cls``; subclass it only to change ``ddp_args``.

    ``ddp_args`` are DistributedDataParallel keywords (e.g.
    ``{"find_unused_parameters": True}`` for a module whose training_step
    leaves some parameters unused).
    """

    _lightning_module_cls: Optional[type] = None
    _ptl_train_dataloader: Any = None
    _ptl_val_dataloader: Any = None
    _ptl_datamodule: Any = None
    ddp_args: Dict[str, Any] = {}

    # ------------------------------------------------------------------ set-up
    def setup(self, config: Dict[str, Any]) -> None:
        if self._lightning_module_cls is None:
            raise ConfigError("LightningOperator is built with TrainingOperator.from_ptl("
                              "YourLightningModule); do not use it directly.")
        self.phase: Optional[str] = None  # "train" / "validate" while one runs
        self.callback_metrics: Dict[str, torch.Tensor] = {}
        self.scheduler_specs: List[SchedulerSpec] = []
        self.lightning_optimizers: List[OperatorOptimizer] = []
        self._synced: set = set()  # optimizers whose gradients this step already averaged
        self._step_taken = False
        self.datamodule = building.instantiate_datamodule(self._ptl_datamodule, config)
        module = building.construct(self._lightning_module_cls, config)
        self._automatic = bool(module.automatic_optimization)
        self._check_settings()
        self._session = ModuleSession(self, module)
        self._stepper = SchedulerStepper([], module.lr_scheduler_step, ddp.average_value)
        self.step_takes_idx = building.takes_batch_idx(module.training_step, "training_step")
        self.val_step_takes_idx = building.takes_batch_idx(module.validation_step,
                                                           "validation_step")
        with self._session.attached():
            self._build(module)

    def _build(self, module: Any) -> None:
        building.prepare_and_setup(module, self.datamodule, self.local_rank, self.world_rank)
        module.to(self.device)  # Lightning builds optimizers with the module on its device
        optimizers, specs = parse_optimizers(module.configure_optimizers(), self._automatic)
        self.register(models=module, optimizers=optimizers,
                      schedulers=[spec.scheduler for spec in specs], ddp_args=dict(self.ddp_args))
        self._ddp_syncs = isinstance(self._models[0], DistributedDataParallel)
        self.scheduler_specs = specs
        self._stepper = SchedulerStepper(specs, module.lr_scheduler_step, ddp.average_value,
                                         enabled=self._automatic)
        self.lightning_optimizers = [OperatorOptimizer(opt, self._optimizer_step)
                                     for opt in self._optimizers]
        train_loader, val_loader = building.loaders(module, self.datamodule,
                                                    self._ptl_train_dataloader,
                                                    self._ptl_val_dataloader)
        self.register_data(train_loader=train_loader, validation_loader=val_loader)
        building.warn_ignored(module)
        module.on_fit_start()
        module.on_train_start()

    def _check_settings(self) -> None:
        settings = self._context.settings
        if not self._automatic and settings.accumulate_steps > 1:
            raise ConfigError(
                f"accumulate_steps={settings.accumulate_steps} splits batches for automatic "
                "optimization; with automatic_optimization = False accumulate in training_step "
                "(call opt.step() every k batches), as Lightning requires.")
        if not self._automatic and settings.clip_grad_norm is not None:
            raise ConfigError(
                "clip_grad_norm applies to automatic optimization; with automatic_optimization "
                "= False call self.clip_gradients(opt, gradient_clip_val=..., "
                "gradient_clip_algorithm='norm') before opt.step(), as Lightning requires.")
        if settings.scheduler_step_freq is not None:
            warnings.warn(f"scheduler_step_freq={settings.scheduler_step_freq!r} is ignored for a "
                          "LightningModule: its schedulers step by their own 'interval' and "
                          "'frequency' from configure_optimizers().", RuntimeWarning, stacklevel=2)

    def _check_registration(self, models, optimizers, schedulers, ddp_args) -> None:
        # Lightning schedulers step by their own interval, so scheduler_step_freq
        # may be None; they are still registered, so commits and checkpoints hold them.
        super()._check_registration(models, optimizers, [], ddp_args)

    def _wrap(self, model: torch.nn.Module, ddp_args: dict) -> torch.nn.Module:
        dispatcher = ddp.StepDispatcher(model)
        if self._automatic:
            wrapped = super()._wrap(dispatcher, ddp_args)
            if wrapped is not dispatcher:
                return wrapped
        ddp.broadcast_module(model)  # what DDP's constructor would have done
        return dispatcher

    # -------------------------------------------------------------- training
    def train_epoch(self, iterator: Iterable, info: Optional[dict] = None,
                    num_steps: Optional[int] = None, epoch_idx: int = 0) -> dict:
        """One ``train()`` call: Lightning's epoch hooks around raysgd's loop over batches."""
        with self._session.attached() as module, self._phase("train"):
            resumed = self._resume_meters is not None  # finishing a call cut short by a failure
            meters = self._meters = self._resume_meters or AverageMeterCollection()
            self._resume_meters = None
            self._models[0].train()
            self._session.logs.begin_epoch()
            if not resumed:
                module.on_train_epoch_start()
            for index, batch in enumerate(iterator):
                batch_idx = getattr(iterator, "batch_idx", index)
                batch = steps.transfer(module, batch, self.device)
                if module.on_train_batch_start(batch, batch_idx) == -1:
                    for _ in iterator:  # Lightning skips the rest of the epoch
                        pass
                    break
                batch_info = {**(info or {}), "batch_idx": batch_idx,
                              "global_step": self.global_step,
                              "epoch_idx": getattr(iterator, "epoch_idx", 0)}
                metrics = dict(self.train_batch(batch, batch_info) or {})
                self.global_step += 1
                self._count(meters, metrics)
            module.on_train_epoch_end()
            summary = {**meters.summary(), **self._session.logs.end_epoch()}
            self._note_callback_metrics(summary)
            self._stepper.after_train(summary, can_validate=self.validation_loader is not None)
        return summary

    def train_batch(self, batch: Any, batch_info: dict) -> dict:
        """One batch (already on the device): the step, ``on_train_batch_end``, its logs."""
        module, logs = self._session.module, self._session.logs
        batch_idx = batch_info.get("batch_idx", 0)
        logs.begin_batch()
        self._step_taken = False
        self._synced.clear()  # gradients averaged for a step that never came are stale
        run = steps.automatic_step if self._automatic else steps.manual_step
        metrics, outputs = run(self, batch, batch_idx)
        module.on_train_batch_end(outputs, batch, batch_idx)
        metrics = self._with_logs(metrics, *logs.end_batch())
        if self._step_taken:
            self._stepper.after_optimizer_step(self.global_step + 1, metrics)
        return metrics

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, skipped: bool) -> None:
        """What ``OperatorOptimizer.step`` does after running the closure."""
        if skipped and self._automatic:  # training_step returned None: no step, as Lightning
            return
        module = self._session.module
        self.sync_gradients(optimizer)
        self.unscale_(optimizer)  # hooks and clipping see true gradients (fp16)
        module.on_before_optimizer_step(optimizer)
        if self._automatic:
            clip = self._context.settings.clip_grad_norm
            module.configure_gradient_clipping(optimizer, clip, None if clip is None else "norm")
        self._step_taken = self.step(optimizer)
        self._synced.discard(id(optimizer))

    def sync_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average ``optimizer``'s gradients over the workers, once per step, unless DDP did.

        ``clip_gradients`` calls it before the step too; the second call is a no-op.
        """
        if self._ddp_syncs or id(optimizer) in self._synced:
            return
        ddp.average_gradients(ddp.optimizer_params(optimizer))
        self._synced.add(id(optimizer))

    # ------------------------------------------------------------ validation
    def validate(self, val_iterator: Iterable, info: Optional[dict] = None) -> dict:
        """One ``validate()`` call with Lightning's validation hooks, in its order."""
        with self._session.attached() as module, self._phase("validate"):
            meters = AverageMeterCollection()
            self._session.logs.begin_epoch()
            module.on_validation_model_eval()
            module.on_validation_start()
            module.on_validation_epoch_start()
            with torch.no_grad():
                for batch_idx, batch in enumerate(val_iterator):
                    batch = steps.transfer(module, batch, self.device)
                    metrics = self.validate_batch(batch, {**(info or {}), "batch_idx": batch_idx})
                    self._count(meters, metrics)
            module.on_validation_epoch_end()
            summary = {**meters.summary(), **self._session.logs.end_epoch()}
            module.on_validation_end()
            module.on_validation_model_train()
            self._note_callback_metrics(summary)
            self._stepper.after_validate(summary)
        return summary

    def validate_batch(self, batch: Any, batch_info: dict) -> dict:
        logs = self._session.logs
        logs.begin_batch()
        metrics, _ = steps.validation_step(self, batch, batch_info.get("batch_idx", 0))
        return self._with_logs(metrics, *logs.end_batch())

    # ----------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, Any]:
        """The module's ``on_save_checkpoint`` dict plus the schedulers' epoch counters."""
        with self._session.attached() as module:
            checkpoint: Dict[str, Any] = {"epoch": self.current_epoch,
                                          "global_step": self.global_step}
            module.on_save_checkpoint(checkpoint)
            if self.datamodule is not None:
                checkpoint["datamodule"] = self.datamodule.state_dict()
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

    @staticmethod
    def _with_logs(metrics: dict, logged: dict, log_batch_size: Optional[int]) -> dict:
        merged = {**metrics, **logged}
        if log_batch_size is not None:  # self.log(..., batch_size=n) weighs the batch
            merged[NUM_SAMPLES] = log_batch_size
        return merged

    def _note_callback_metrics(self, summary: dict) -> None:
        # Lightning's trainer.callback_metrics: the latest value of every metric, as tensors.
        self.callback_metrics.update({key: torch.tensor(float(value))
                                      for key, value in summary.items()
                                      if is_number(value) and not key.startswith("last_")})
