"""Attaching a LightningModule to raysgd while raysgd runs its code.

Lightning routes ``self.log``, ``self.optimizers()``, ``self.manual_backward``,
``self.clip_gradients`` and ``self.all_gather`` through private Trainer
machinery (result collections, strategies, precision plugins) that changes
between releases. raysgd instead replaces those public methods on the module
*instance* for the duration of each operator call, and sets ``self.trainer``
to a :class:`TrainerStub` through the public setter. Outside the calls the
module is a plain LightningModule again, so what ``trainer.get_model()``
returns pickles and saves like any module. Inside them an instance
``__getstate__`` leaves the intercepts out of the module's pickled and copied
state (Lightning's own drops the trainer), so ``torch.save(self)`` or
``copy.deepcopy(self)`` in a hook never drags the operator along.

While attached, the module also gets ``v1``'s wrappers (an overridden
``training_step_end`` / ``validation_step_end`` applied to the step's output) and, for
a Lightning 1.x module, adapters that give its hooks the 2.x signatures raysgd calls.

Attaching is re-entrant (a commit taken between batches saves the module's
checkpoint hooks inside ``train()``) and assumes one thread drives the
operator at a time, which the runner guarantees.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Optional

import torch

from raysgd.errors import ConfigError
from raysgd.lightning import ddp, v1
from raysgd.lightning.logs import LogCollector
from raysgd.lightning.trainer_stub import TrainerStub
from raysgd.lightning.wrapped_optimizer import OperatorOptimizer
from raysgd.worker.precision import Precision

INTERCEPTED = ("log", "log_dict", "optimizers", "lr_schedulers", "manual_backward",
               "clip_gradients", "all_gather")
CLIP_ALGORITHMS = ("norm", "value")


def unwrap(optimizer: Any) -> Any:
    return optimizer.optimizer if isinstance(optimizer, OperatorOptimizer) else optimizer


def _state_without_intercepts(module: torch.nn.Module, names: tuple) -> Any:
    """The class's ``__getstate__`` (Lightning's drops the trainer) minus raysgd's intercepts."""
    state = type(module).__getstate__(module)
    if isinstance(state, dict):
        state = {k: v for k, v in state.items() if k not in names and k != "__getstate__"}
    return state


class ModuleSession:
    """The operator's side of one module: the trainer stub, the log collector, the intercepts."""

    def __init__(self, operator: Any, module: torch.nn.Module, lightning_1x: bool = False):
        self._op = operator
        self.module = module
        self.stub = TrainerStub(operator)
        self.logs = LogCollector(lambda: operator.world_rank == 0,
                                 lambda: getattr(operator, "phase", None))
        self._lightning_1x = lightning_1x  # its hooks get 2.x signatures (raysgd.lightning.v1)
        self._installed: tuple = ()
        self._depth = 0

    @contextlib.contextmanager
    def attached(self):
        """The module, attached to raysgd for the duration of the block."""
        if self._depth == 0:
            self._attach()
        self._depth += 1
        try:
            yield self.module
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._detach()

    def _attach(self) -> None:
        self.module.trainer = self.stub
        installed = {name: getattr(self, name) for name in INTERCEPTED}
        installed.update(v1.step_end_wrappers(self.module))
        if self._lightning_1x:
            native = self._op._context.precision.name in ("float16", "bfloat16")
            installed.update(v1.adapters(self.module, using_native_amp=native))
        vars(self.module).update(installed)
        self._installed = tuple(installed)
        # pickle, copy and deepcopy look __getstate__ up on the instance first.
        vars(self.module)["__getstate__"] = functools.partial(_state_without_intercepts,
                                                              self.module, self._installed)

    def _detach(self) -> None:
        for name in (*self._installed, "__getstate__"):
            vars(self.module).pop(name, None)
        self._installed = ()
        self.module.trainer = None

    # ------------------------------------------------------ the intercepts
    def log(self, *args: Any, **kwargs: Any) -> None:
        self.logs.log(*args, **kwargs)

    def log_dict(self, *args: Any, **kwargs: Any) -> None:
        self.logs.log_dict(*args, **kwargs)

    def optimizers(self, use_pl_optimizer: bool = True):
        found = self._op.lightning_optimizers if use_pl_optimizer else self._op._optimizers
        return found[0] if len(found) == 1 else list(found)

    def lr_schedulers(self):
        schedulers = [spec.scheduler for spec in self._op.scheduler_specs]
        if not schedulers:
            return None
        return schedulers[0] if len(schedulers) == 1 else schedulers

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._op.optimization.check_manual_backward()  # the mode read once at set-up
        self.module.on_before_backward(loss)
        self.backward(loss, *args, **kwargs)
        self.module.on_after_backward()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The operator's precision-aware backward; extra arguments need an unscaled precision."""
        precision = self._op._context.precision
        if not args and not kwargs:
            self._op.backward(loss)
        elif type(precision).backward is Precision.backward:
            loss.backward(*args, **kwargs)
        else:
            raise ConfigError(
                f"self.manual_backward(loss, *{args!r}, **{kwargs!r}): extra backward arguments "
                f"are not supported with use_fp16 giving {precision.name} loss scaling; call "
                "self.manual_backward(loss) without them (e.g. detach instead of retain_graph).")

    def clip_gradients(self, optimizer: Any, gradient_clip_val: Optional[float] = None,
                       gradient_clip_algorithm: Optional[str] = None) -> None:
        """Clip ``optimizer``'s gradients (averaged over workers first, then unscaled)."""
        settings_value = self._op._context.settings.clip_grad_norm
        value = settings_value if gradient_clip_val is None else gradient_clip_val
        if not value:
            return
        algorithm = (gradient_clip_algorithm or "norm").lower()
        if algorithm not in CLIP_ALGORITHMS:
            raise ConfigError(f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not valid; "
                              f"use one of {list(CLIP_ALGORITHMS)}.")
        optimizer = unwrap(optimizer)
        self._op.sync_gradients(optimizer)
        params = [p for p in ddp.optimizer_params(optimizer) if p.grad is not None]
        if algorithm == "norm":  # the operator's helper: unscales, then clips
            self._op.clip_grad_norm_(params, float(value))
        else:
            self._op.unscale_(optimizer)
            torch.nn.utils.clip_grad_value_(params, float(value))

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        if group is not None or sync_grads:
            raise ConfigError("self.all_gather(data) gathers over all workers without gradients; "
                              "group= and sync_grads=True are not supported by raysgd.")
        return ddp.gather(data, self._op.device)
