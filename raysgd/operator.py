"""``TrainingOperator``: the class users subclass to describe their training."""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

import torch
from torch import nn

from raysgd.errors import ConfigError
from raysgd.worker import distributed
from raysgd.worker.batches import check_tuple_batch, move_to_device, split_batch
from raysgd.worker.metrics import NUM_SAMPLES, AverageMeterCollection
from raysgd.worker.progress import BatchEvents
from raysgd.worker.returns import batch_metrics
from raysgd.worker.strategy import ReplicatedStrategy
from raysgd.worker.timers import NULL_TIMERS


class OperatorContext:
    """What the runner tells an operator about its process; built once per worker."""

    def __init__(self, rank, device, settings, precision, events=None, strategy=None):
        self.rank = rank
        self.device = device
        self.settings = settings
        self.precision = precision
        self.strategy = strategy or ReplicatedStrategy(rank, device, settings.wrap_ddp)
        self.events = events if events is not None else BatchEvents()  # read by the progress bar


def _as_list(value: Any) -> list:
    return [] if value is None else list(value) if isinstance(value, (list, tuple)) else [value]


def _shaped(given: Any, items: list) -> Any:
    """Return ``items`` in the container the user gave: list → list, tuple → tuple, one → one."""
    if isinstance(given, list):
        return list(items)
    return tuple(items) if isinstance(given, tuple) else items[0]


class TrainingOperator:
    """Subclass this and override ``setup``; never construct it yourself.

    The runner drives one operator per worker process like this::

        operator = YourOperator(config, context)      # calls setup(config)
        for each trainer.train() call:
            iterator = batches of the train loader     # continues the current pass
            metrics = operator.train_epoch(iterator, info)           # a dict or None
                for batch in iterator:
                    metrics = operator.train_batch(batch, batch_info)    # a dict or None
                        with self.autocast(): output = model(*features); loss = criterion(output, target)
                        self.backward(loss); self.step(optimizer)
                    operator.global_step += 1
                step schedulers if scheduler_step_freq == "epoch"
        for each trainer.validate() call:
            metrics = operator.validate(val_iterator, info)          # a dict or None
                for batch in val_iterator: operator.validate_batch(batch, batch_info)  # same

    Override any level (returning another type raises ``ConfigError``). Custom loops call
    ``self.autocast()``, ``self.backward(loss)``, ``self.clip_grad_norm_(model, max_norm)``,
    ``self.step(optimizer)``, ``self.micro_batches(batch)``: fp16, clipping, accumulation work.
    """

    def __init__(self, config: Dict[str, Any], context: OperatorContext):
        self._config = config
        self._context = context
        self._original_models: list = []
        self._models: list = []
        self._optimizers: list = []
        self._schedulers: list = []
        self._criterion = None
        self._train_loader = None
        self._validation_loader = None
        self._registered = False
        self.global_step = 0
        self.timers = NULL_TIMERS
        self._meters: Optional[AverageMeterCollection] = None  # snapshotted by commits
        self._resume_meters: Optional[AverageMeterCollection] = None
        self.setup(config)

    # ----------------------------------------------------------------- hooks
    def setup(self, config: Dict[str, Any]) -> None:
        """Create models, optimizers, loss, schedulers and loaders; register them."""
        raise NotImplementedError(
            f"{type(self).__name__} must override setup(self, config) and call "
            "self.register(models=..., optimizers=...) there.")

    def train_epoch(self, iterator: Iterable, info: Optional[dict] = None,
                    num_steps: Optional[int] = None, epoch_idx: int = 0) -> dict:
        """Train over ``iterator``; returns a dict of metrics or None (``train_batch``'s, averaged).

        ``info`` holds the call's ``NUM_STEPS``, ``SCHEDULER_STEP``, ``USE_FP16`` and
        ``epoch_idx`` plus ``trainer.train(info=...)``. An override may take Ray 1.12's
        keywords ``num_steps`` and ``epoch_idx`` or just ``(iterator, info)``. Each
        ``batch_info`` is ``info`` plus ``batch_idx`` (in the pass), ``global_step`` and
        ``epoch_idx`` (the batch's 0-based pass).
        """
        for model in self._models:
            model.train()
        # After a recovery the meters continue from the commit, so the call's
        # metrics still cover every batch of it.
        meters = self._meters = self._resume_meters or AverageMeterCollection()
        self._resume_meters = None
        for index, batch in enumerate(iterator):
            batch_info = {**(info or {}), "batch_idx": getattr(iterator, "batch_idx", index),
                          "global_step": self.global_step,
                          "epoch_idx": getattr(iterator, "epoch_idx", 0)}
            self._count(meters, self.train_batch(batch, batch_info), "train_batch")
            self.global_step += 1
        if self.scheduler_step_freq == "epoch":
            for scheduler in self._schedulers:
                scheduler.step()
        return meters.summary()

    def _count(self, meters: AverageMeterCollection, result: Any, hook: str) -> None:
        metrics = batch_metrics(result, self, hook)  # a fresh dict: num_samples is popped
        num_samples = metrics.pop(NUM_SAMPLES, 1)
        meters.update(metrics, n=num_samples)
        self._context.events.finished_batch(metrics, num_samples)

    def train_batch(self, batch: Any, batch_info: dict) -> dict:
        """One optimisation step on ``batch`` (``*features, target = batch``).

        Returns a dict of metrics or None. Numbers (numpy scalars and 0-d tensors too) are
        averaged over the call, weighted by ``num_samples`` (a number; 1 when absent); other
        values are reported as the last one seen. With ``accumulate_steps=k`` the batch is
        split into k micro-batches whose gradients add up before one step (all-reduced once);
        with ``clip_grad_norm`` the gradients are clipped (unscaled) before it.
        """
        model, optimizer, criterion = self._single("train_batch")
        check_tuple_batch(batch, "train_batch")
        optimizer.zero_grad(set_to_none=True)
        total_loss, num_samples = 0.0, 0
        for (*features, target), weight in self.micro_batches(move_to_device(batch, self.device)):
            with self.timers.record("fwd"):
                with self.autocast():
                    output = model(*features)
                    loss = criterion(output, target)
            with self.timers.record("grad"):
                self.backward(loss if weight == 1 else loss * weight)
            # One micro-batch (the default) adds no op a step (the meter copies the loss).
            total_loss = loss.detach() if weight == 1 else total_loss + loss.float().detach() * weight
            num_samples += target.size(0)
        with self.timers.record("apply"):
            if self._context.settings.clip_grad_norm is not None:
                self.clip_grad_norm_(model, self._context.settings.clip_grad_norm)
            stepped = self.step(optimizer)
        # A skipped fp16 step is no step; asked last, as reading it waits for the GPU.
        if self.scheduler_step_freq == "batch" and self._schedulers and stepped:
            for scheduler in self._schedulers:
                scheduler.step()
        return {"train_loss": total_loss, NUM_SAMPLES: num_samples}  # 0-d: float() waits for a GPU

    def validate(self, val_iterator: Iterable, info: Optional[dict] = None) -> dict:
        """Evaluate over ``val_iterator``; returns a dict of metrics or None (``validate_batch``'s)."""
        for model in self._models:
            model.eval()
        meters = AverageMeterCollection()
        with torch.no_grad():
            for batch_idx, batch in enumerate(val_iterator):
                batch_info = {"batch_idx": batch_idx, **(info or {})}
                self._count(meters, self.validate_batch(batch, batch_info), "validate_batch")
        return meters.summary()

    def validate_batch(self, batch: Any, batch_info: dict) -> dict:
        """Loss and accuracy on one batch (argmax for class scores, 0.5 threshold for one
        output); returns a dict of metrics or None, as ``train_batch`` does."""
        model, _, criterion = self._single("validate_batch")
        *features, target = move_to_device(check_tuple_batch(batch, "validate_batch"), self.device)
        with self.timers.record("eval_fwd"):
            with self.autocast():
                output = model(*features)
                loss = criterion(output, target)
        if output.dim() == 2 and output.size(1) > 1:
            predicted = output.argmax(dim=1)
        else:
            predicted = (output > 0.5).to(target.dtype).view_as(target)
        num_samples = target.size(0)
        correct = (predicted == target).sum().item()
        return {"val_loss": loss.item(), "val_accuracy": correct / max(num_samples, 1),
                NUM_SAMPLES: num_samples}

    def state_dict(self) -> Any:
        """Extra state to checkpoint besides models, optimizers and schedulers."""
        return None

    def load_state_dict(self, state_dict: Any) -> None:
        """Restore what :meth:`state_dict` returned."""

    # ------------------------------------------------------------ registration
    def register(self, *, models, optimizers, criterion=None, schedulers=None,
                 ddp_args=None, apex_args=None):
        """Hand the training components to raysgd; returns them ready to use.

        Returns ``(models, optimizers[, criterion][, schedulers])`` with each item
        in the container given (one object → one object, a list → a list, a
        tuple → a tuple). Models come back on the worker's device and, when
        distributed with ``wrap_ddp=True``, wrapped in ``DistributedDataParallel``; under
        ``strategy=FSDP(...)`` sharded in place, the optimizers re-pointed at the shards.
        """
        if self._registered:
            raise ConfigError("register() was called twice; call it once in setup().")
        model_list, optimizer_list = _as_list(models), _as_list(optimizers)
        scheduler_list = _as_list(schedulers)
        self._check_registration(model_list, optimizer_list, scheduler_list, ddp_args)
        strategy = self._context.strategy
        model_list = strategy.place(model_list)
        if isinstance(criterion, nn.Module):
            criterion = criterion.to(self.device)
        precision = self._context.precision
        if apex_args is not None and hasattr(precision, "_apex_args"):
            precision._apex_args = dict(apex_args)
        model_list, optimizer_list = precision.setup(model_list, optimizer_list)
        self._original_models = model_list
        strategy.shard(model_list, optimizer_list, ddp_args or {})
        self._models = [self._wrap(model, ddp_args or {}) for model in model_list]
        self._optimizers, self._schedulers, self._criterion = optimizer_list, scheduler_list, criterion
        self._registered = True
        return self._publish(models, optimizers, criterion, schedulers)

    def register_data(self, *, train_loader=None, validation_loader=None) -> None:
        """Hand over the loaders (a DistributedSampler is added when distributed), or
        ``ray.data.Dataset`` objects: rank 0's are split and streamed to every rank."""
        rank = self._context.rank
        if rank.distributed and self._context.settings.add_dist_sampler:
            train_loader = distributed.with_distributed_sampler(train_loader, rank)
            validation_loader = distributed.with_distributed_sampler(validation_loader, rank)
        self._train_loader, self._validation_loader = train_loader, validation_loader

    def _check_registration(self, models, optimizers, schedulers, ddp_args) -> None:
        if not models:
            raise ConfigError("register() needs at least one model: register(models=model, ...).")
        bad = [type(m).__name__ for m in models if not isinstance(m, nn.Module)]
        if bad:
            raise ConfigError(f"register(models=...) takes torch.nn.Module objects; got {bad}. "
                              "Pass the model instance, not a creator function or class.")
        if not optimizers:
            raise ConfigError("register() needs at least one optimizer: register(optimizers=opt, ...).")
        if ddp_args is not None and not isinstance(ddp_args, dict):
            raise ConfigError(f"ddp_args must be a dict of DistributedDataParallel keyword "
                              f"arguments, got {type(ddp_args).__name__}.")
        if schedulers and self.scheduler_step_freq is None:
            raise ConfigError("A scheduler was registered but scheduler_step_freq is None; pass "
                              "TorchTrainer(scheduler_step_freq='epoch' | 'batch' | 'manual').")

    def _wrap(self, model: nn.Module, ddp_args: dict) -> nn.Module:
        return self._context.strategy.wrap_model(model, ddp_args)

    def _publish(self, models, optimizers, criterion, schedulers):
        self.models, self.optimizers, self.schedulers = self._models, self._optimizers, self._schedulers
        self.model = self._models[0] if len(self._models) == 1 else None
        self.optimizer = self._optimizers[0] if len(self._optimizers) == 1 else None
        self.scheduler = self._schedulers[0] if len(self._schedulers) == 1 else None
        self.criterion = self._criterion
        out = [_shaped(models, self._models), _shaped(optimizers, self._optimizers)]
        if criterion is not None:
            out.append(self._criterion)
        if schedulers is not None:
            out.append(_shaped(schedulers, self._schedulers))
        return tuple(out)

    def _single(self, hook: str):
        if len(self._models) != 1 or len(self._optimizers) != 1 or self._criterion is None:
            raise ConfigError(
                f"The default {hook} needs exactly one model, one optimizer and a criterion "
                f"(registered: {len(self._models)} models, {len(self._optimizers)} optimizers, "
                f"criterion={'yes' if self._criterion is not None else 'no'}). "
                f"Override {hook} in {type(self).__name__} for multi-model training.")
        return self._models[0], self._optimizers[0], self._criterion

    # ----------------------------------------------------------------- helpers
    def autocast(self):
        """Context manager for forward passes in the configured precision."""
        return self._context.precision.autocast()

    def backward(self, *losses: torch.Tensor) -> None:
        """``loss.backward()`` with loss scaling when the precision needs it."""
        self._context.precision.backward(*losses)

    def step(self, optimizer: torch.optim.Optimizer) -> Any:
        """``optimizer.step()``, scaler-aware; falsy when an fp16 overflow skipped it."""
        return self._context.precision.step(optimizer)

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the loss scale out of ``optimizer``'s gradients now (once per step)."""
        self._context.precision.unscale_(optimizer)

    def clip_grad_norm_(self, params_or_model: Any, max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor:
        """Clip gradients to ``max_norm``, unscaling them first; returns the norm before clipping.

        Takes a model or an iterable of parameters. Every registered optimizer
        holding one of the parameters is unscaled, so call it between
        ``backward`` and ``step``.
        """
        if isinstance(params_or_model, nn.Module):
            params = list(params_or_model.parameters())
        elif isinstance(params_or_model, torch.Tensor):
            params = [params_or_model]
        else:
            params = list(params_or_model)
        wanted = {id(p) for p in params}
        for optimizer in self._optimizers:
            if any(id(p) in wanted for group in optimizer.param_groups for p in group["params"]):
                self.unscale_(optimizer)
        return self._context.strategy.clip_grad_norm_(params, max_norm, norm_type)

    def no_sync(self, models: Optional[Iterable[nn.Module]] = None):
        """Skip the gradient all-reduce inside the block (for non-final micro-batches)."""
        return self._context.strategy.no_sync(self._models if models is None else _as_list(models))

    def micro_batches(self, batch: Any, num: Optional[int] = None,
                      models: Optional[Iterable[nn.Module]] = None):
        """Split ``batch`` into ``num`` (default ``accumulate_steps``) micro-batches.

        Yields ``(micro_batch, weight)`` with ``weight = len(micro_batch) / len(batch)``;
        scale each micro-batch's mean loss by it so the gradients add up to the
        full batch's. All but the last micro-batch run inside :meth:`no_sync`,
        so DDP all-reduces once, after the last backward::

            for (x, y), weight in self.micro_batches(batch):
                with self.autocast():
                    loss = self.criterion(self.model(x), y)
                self.backward(loss * weight)
            self.step(self.optimizer)
        """
        pieces = split_batch(batch, num or self._context.settings.accumulate_steps)
        for index, (piece, weight) in enumerate(pieces):
            if index == len(pieces) - 1:
                yield piece, weight
            else:
                with self.no_sync(models):
                    yield piece, weight

    # -------------------------------------------------------------- properties
    @property
    def config(self) -> Dict[str, Any]:
        return self._config

    @property
    def device(self) -> torch.device:
        return self._context.device

    @property
    def device_ids(self) -> Optional[list]:
        return distributed.device_ids(self._context.device)

    @property
    def world_rank(self) -> int:
        return self._context.rank.world_rank

    @property
    def local_rank(self) -> int:
        return self._context.rank.local_rank

    @property
    def world_size(self) -> int:
        return self._context.rank.world_size

    @property
    def use_gpu(self) -> bool:
        return self._context.device.type == "cuda"

    @property
    def use_fp16(self):
        return self._context.settings.use_fp16

    @property
    def use_tqdm(self) -> bool:
        return self._context.settings.use_tqdm

    @property
    def scheduler_step_freq(self) -> Optional[str]:
        return self._context.settings.scheduler_step_freq

    @property
    def train_loader(self):
        return self._train_loader

    @property
    def validation_loader(self):
        return self._validation_loader

    @classmethod
    def from_creators(cls, model_creator, optimizer_creator, data_creator=None,
                      loss_creator=None, scheduler_creator=None, serialize_data_creation=True):
        """Build an operator class from legacy creator functions (see ``CreatorOperator``)."""
        from raysgd.creator_operator import make_creator_operator
        return make_creator_operator(model_creator, optimizer_creator, data_creator,
                                     loss_creator, scheduler_creator, serialize_data_creation)

    @classmethod
    def from_ptl(cls, lightning_module_cls, train_dataloader=None, val_dataloader=None, datamodule=None,
                 *, module_args=(), module_kwargs=None):
        """A LightningModule class, instance or factory as an operator class: see raysgd.lightning.factory."""
        from raysgd.lightning import make_lightning_operator
        return make_lightning_operator(lightning_module_cls, train_dataloader, val_dataloader,
                                       datamodule, module_args, module_kwargs)
