"""One batch of a LightningModule: automatic or manual optimization, or validation.

Each step function returns ``(metrics, outputs)``: the batch's raysgd metrics
(``train_loss``, scalar entries of the step's dict, ``num_samples``) and the
step's output as Lightning hands it to ``on_*_batch_end``. :data:`AUTOMATIC`
and :data:`MANUAL` are the two optimization modes; the operator picks one
(:func:`optimization_of`) once the module's setup hooks ran.
"""
from __future__ import annotations

import numbers
from typing import Any, Dict, Mapping, Optional, Tuple

import torch

from raysgd.errors import ConfigError
from raysgd.lightning.logs import to_value
from raysgd.worker.metrics import NUM_SAMPLES
from raysgd.worker.returns import training_step


def transfer(module: Any, batch: Any, device: torch.device) -> Any:
    """Lightning's three batch-transfer hooks, in its order."""
    batch = module.on_before_batch_transfer(batch, 0)
    batch = module.transfer_batch_to_device(batch, device, 0)
    return module.on_after_batch_transfer(batch, 0)


def batch_size_of(batch: Any) -> Optional[int]:
    """The first dimension of the first tensor in ``batch`` (Lightning's inference), or None."""
    if isinstance(batch, torch.Tensor):
        return batch.size(0) if batch.dim() else 1
    items = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(items, (list, tuple)) or isinstance(batch, Mapping):
        for item in items:
            size = batch_size_of(item)
            if size is not None:
                return size
    return None


def split_output(output: Any, hook: str, automatic: bool = False,
                 owner: Any = "LightningModule") -> Tuple[Optional[torch.Tensor], Dict[str, Any]]:
    """``(loss or None, other entries)`` of what a step returned; Lightning's rule for what it
    may return, and the message naming ``owner`` (the module), are in raysgd.worker.returns."""
    return training_step(output, owner, automatic, hook)


def scalars(entries: Mapping[str, Any]) -> Dict[str, Any]:
    """The entries that are one number (a number or a one-element tensor): floats, and 0-d
    tensors left unread (:func:`~raysgd.lightning.logs.to_value`)."""
    out = {}
    for key, value in entries.items():
        one = (isinstance(value, numbers.Number) and not isinstance(value, bool)) or (
            isinstance(value, torch.Tensor) and value.numel() == 1)
        if one:
            value = to_value(str(key), value)
            if key == NUM_SAMPLES:  # it weighs the batch, so it is read now, and kept a count
                value = float(value)
                value = int(value) if value.is_integer() else value
            out[str(key)] = value
    return out


def _args(batch: Any, batch_idx: int, takes_idx: bool) -> tuple:
    return (batch, batch_idx) if takes_idx else (batch,)


def automatic_step(op: Any, batch: Any, batch_idx: int) -> Tuple[dict, Any]:
    """Lightning's automatic optimization, with raysgd's precision, clipping and accumulation.

    ``optimizer_step(epoch, batch_idx, optimizer, closure)`` is the module's
    hook (an override, e.g. for warm-up, is honoured); the closure runs
    ``training_step`` through the DDP-wrapped dispatcher for each micro-batch,
    zeroes the gradients after the first one (Lightning's order:
    ``training_step``, ``on_before_zero_grad``, ``optimizer_zero_grad``,
    backward) and does the backward passes.
    """
    module, optimizer = op.get_model(), op.lightning_optimizers[0]
    ran: Dict[str, Any] = {}

    def closure():
        total, samples, extras, output = 0.0, 0, {}, None
        for index, (piece, weight) in enumerate(op.micro_batches(batch)):
            with op.autocast():
                output = op._models[0](*_args(piece, batch_idx, op.step_takes_idx))
            loss, piece_extras = split_output(output, "training_step", True, module)
            if index == 0:
                module.on_before_zero_grad(optimizer.optimizer)
                module.optimizer_zero_grad(op.current_epoch, batch_idx, optimizer.optimizer)
            if loss is None:
                if op.world_size > 1:  # the other ranks would wait in the gradient all-reduce
                    raise ConfigError(
                        f"{type(module).__name__}.training_step returned None with several "
                        "workers; Lightning 2.x does not support skipping a step in distributed "
                        "training either. Return a loss (e.g. loss * 0 to make the batch count "
                        "for nothing).")
                ran.update(output=output, skipped=True)
                return None
            module.on_before_backward(loss)
            op.backward(loss if weight == 1 else loss * weight)
            module.on_after_backward()
            # The same arithmetic as TrainingOperator.train_batch, so results match it exactly.
            total = total + loss.detach().float() * weight
            samples += batch_size_of(piece) or 1
            extras = piece_extras
        ran.update(total=total, samples=samples, extras=extras, output=output)
        return total

    module.optimizer_step(op.current_epoch, batch_idx, optimizer, closure)
    if not ran:
        raise ConfigError(f"{type(module).__name__}.optimizer_step did not call "
                          "optimizer.step(closure=optimizer_closure); the closure runs "
                          "training_step and the backward pass, so it must be called.")
    if ran.get("skipped"):
        return {NUM_SAMPLES: batch_size_of(batch) or 1}, None
    # The loss stays a 0-d tensor, as TrainingOperator.train_batch leaves it: read every
    # step, it would make the CPU wait for the GPU.
    # A copy: on_train_batch_end gets the outputs' loss and may change it in place.
    metrics = {"train_loss": to_value("loss", ran["total"]), NUM_SAMPLES: ran["samples"],
               **scalars(ran["extras"])}
    outputs = {**ran["extras"], "loss": ran["total"]}
    return metrics, outputs


def manual_step(op: Any, batch: Any, batch_idx: int) -> Tuple[dict, Any]:
    """Manual optimization: ``training_step`` steps its optimizers itself.

    It runs on the module directly, not through DDP: with several backward
    passes per step DDP's hooks would all-reduce at the wrong time, so each
    ``opt.step()`` averages its own gradients instead.
    """
    module = op.get_model()
    with op.autocast():
        output = module.training_step(*_args(batch, batch_idx, op.step_takes_idx))
    loss, extras = split_output(output, "training_step", False, module)
    metrics = scalars(extras)
    if loss is not None:
        metrics["train_loss"] = to_value("loss", loss)
    metrics.setdefault(NUM_SAMPLES, batch_size_of(batch) or 1)
    return metrics, output


def validation_step(op: Any, batch: Any, batch_idx: int) -> Tuple[dict, Any]:
    """``validation_step``: a dict's scalar entries are metrics, a bare tensor is ``val_loss``;
    any other output (Lightning 1.x and 2.x take anything) carries no metrics."""
    module = op.get_model()
    module.on_validation_batch_start(batch, batch_idx)
    with op.autocast():
        output = module.validation_step(*_args(batch, batch_idx, op.val_step_takes_idx))
    module.on_validation_batch_end(output, batch, batch_idx)
    if isinstance(output, torch.Tensor):
        metrics = scalars({"val_loss": output})
    elif isinstance(output, Mapping):
        metrics = scalars(output)
    else:
        metrics = {}
    metrics.setdefault(NUM_SAMPLES, batch_size_of(batch) or 1)
    return metrics, output


class Automatic:
    """Lightning's automatic optimization: raysgd steps the one optimizer every batch."""

    automatic = True
    run = staticmethod(automatic_step)

    def check_settings(self, settings: Any) -> None:
        """accumulate_steps and clip_grad_norm both apply."""

    def clip(self, module: Any, optimizer: Any, clip_value: Optional[float]) -> None:
        module.configure_gradient_clipping(optimizer, clip_value,
                                           None if clip_value is None else "norm")

    def check_manual_backward(self) -> None:
        raise ConfigError("self.manual_backward(loss) is for manual optimization: set "
                          "self.automatic_optimization = False in __init__, or return the "
                          "loss from training_step and let raysgd step.")


class Manual:
    """``automatic_optimization = False``: ``training_step`` steps its optimizers itself."""

    automatic = False
    run = staticmethod(manual_step)

    def check_settings(self, settings: Any) -> None:
        if settings.accumulate_steps > 1:
            raise ConfigError(
                f"accumulate_steps={settings.accumulate_steps} splits batches for automatic "
                "optimization; with automatic_optimization = False accumulate in training_step "
                "(call opt.step() every k batches), as Lightning requires.")
        if settings.clip_grad_norm is not None:
            raise ConfigError(
                "clip_grad_norm applies to automatic optimization; with automatic_optimization "
                "= False call self.clip_gradients(opt, gradient_clip_val=..., "
                "gradient_clip_algorithm='norm') before opt.step(), as Lightning requires.")

    def clip(self, module: Any, optimizer: Any, clip_value: Optional[float]) -> None:
        """The user clips with self.clip_gradients, as in Lightning."""

    def check_manual_backward(self) -> None:
        """manual_backward is what manual optimization uses."""


AUTOMATIC, MANUAL = Automatic(), Manual()


def optimization_of(module: Any) -> Any:
    """The module's mode, read once (after ``setup`` / ``configure_model``, which may set it)."""
    return AUTOMATIC if module.automatic_optimization else MANUAL
