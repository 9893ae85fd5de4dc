"""Lightning 1.x (1.6-1.9) modules: the hooks whose signatures changed in 2.0, and the 1.x
hooks that 2.0 removed.

raysgd's loops call the 2.x signatures. While a 1.x module is attached
(``session.py``), :func:`adapters` puts instance attributes in front of the
hooks that took an ``optimizer_idx`` or ``dataloader_idx`` in 1.x, each calling
the class's hook as Lightning 1.x did (index 0: raysgd trains one optimizer in
automatic optimization, and one validation loader):

=====================================  ===========================================================
raysgd calls (2.x)                     the 1.x hook gets
=====================================  ===========================================================
``optimizer_step(e, i, opt, closure)`` ``(e, i, opt, 0, closure, on_tpu=, using_native_amp=,
                                       using_lbfgs=)``, each keyword only if the hook takes it
``optimizer_zero_grad(e, i, opt)``     ``(e, i, opt, 0)``
``on_before_optimizer_step(opt)``      ``(opt, 0)``
``configure_gradient_clipping(opt,     ``(opt, 0, value, algorithm)``
value, algorithm)``
``lr_scheduler_step(sched, metric)``   ``(sched, 0, metric)``
``on_validation_batch_start/end``      the same arguments plus ``dataloader_idx=0``
=====================================  ===========================================================

For a module of either version, :func:`step_end_wrappers` applies an overridden
``training_step_end`` / ``validation_step_end`` to the step's output (a ``None``
from it keeps the step's own output, as in 1.x), and :class:`EpochOutputs`
collects the step outputs that ``training_epoch_end(outputs)`` /
``validation_epoch_end(outputs)`` receive (only when the module overrides them); what
those return is read as Ray 1.12 read it. Lightning 2.0 removed those four hooks; raysgd
calls them whatever the version, so code ported from Ray 1.x runs unchanged.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from raysgd.errors import ConfigError
from raysgd.lightning.compat import find_base, is_overridden
from raysgd.worker.batches import map_tensors
from raysgd.worker.metrics import NUM_SAMPLES
from raysgd.lightning.steps import scalars

# 1.x hooks raysgd does not call, and why (said once per worker at set-up).
NOT_CALLED = {
    "on_epoch_start": "removed in Lightning 1.8; use on_train_epoch_start / "
                      "on_validation_epoch_start",
    "on_epoch_end": "removed in Lightning 1.8; use on_train_epoch_end / on_validation_epoch_end",
    "on_pretrain_routine_start": "removed in Lightning 1.8; use on_fit_start",
    "on_pretrain_routine_end": "removed in Lightning 1.8; use on_fit_start",
}
STEP_END = {"training_step": "training_step_end", "validation_step": "validation_step_end"}
EPOCH_END = {"train": "training_epoch_end", "validate": "validation_epoch_end"}


def overrides(module: Any, hook: str) -> bool:
    return is_overridden(hook, module, find_base(type(module), "LightningModule"))


def check_module(module: Any) -> None:
    """What raysgd cannot run of a 1.x module, refused at set-up with the fix."""
    if getattr(module, "truncated_bptt_steps", 0):
        raise ConfigError(f"{type(module).__name__}.truncated_bptt_steps = "
                          f"{module.truncated_bptt_steps}: raysgd does not split batches in time "
                          "(Lightning 2.0 removed it too); run the sequence in training_step, "
                          "e.g. a loop over chunks with manual optimization.")


def adapters(module: Any, using_native_amp: bool) -> Dict[str, Callable]:
    """Instance attributes that give a 1.x module's hooks the 2.x signatures raysgd calls."""
    cls = type(module)

    def optimizer_step(epoch, batch_idx, optimizer, optimizer_closure=None):
        options = {"on_tpu": False, "using_native_amp": using_native_amp,
                   "using_lbfgs": isinstance(getattr(optimizer, "optimizer", optimizer),
                                             torch.optim.LBFGS)}
        return cls.optimizer_step(module, epoch, batch_idx, optimizer, 0, optimizer_closure,
                                  **_accepted(cls.optimizer_step, options))

    return {
        "optimizer_step": optimizer_step,
        "optimizer_zero_grad": lambda epoch, batch_idx, optimizer:
            cls.optimizer_zero_grad(module, epoch, batch_idx, optimizer, 0),
        "on_before_optimizer_step": lambda optimizer:
            cls.on_before_optimizer_step(module, optimizer, 0),
        "configure_gradient_clipping": lambda optimizer, value=None, algorithm=None:
            cls.configure_gradient_clipping(module, optimizer, 0, value, algorithm),
        "lr_scheduler_step": lambda scheduler, metric:
            cls.lr_scheduler_step(module, scheduler, 0, metric),
        "on_validation_batch_start": lambda batch, batch_idx, dataloader_idx=0:
            cls.on_validation_batch_start(module, batch, batch_idx, dataloader_idx),
        "on_validation_batch_end": lambda outputs, batch, batch_idx, dataloader_idx=0:
            cls.on_validation_batch_end(module, outputs, batch, batch_idx, dataloader_idx),
    }


def _accepted(hook: Callable, options: Dict[str, Any]) -> Dict[str, Any]:
    """The keyword ``options`` that ``hook`` takes (1.9 dropped ``using_native_amp``)."""
    try:
        params = inspect.signature(hook).parameters
    except (TypeError, ValueError):
        return options
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return options
    return {name: value for name, value in options.items() if name in params}


def step_end_wrappers(module: Any) -> Dict[str, Callable]:
    """``training_step`` / ``validation_step`` followed by their overridden ``*_step_end``."""
    cls, wrappers = type(module), {}
    for step, end in STEP_END.items():
        if overrides(module, end):
            wrappers[step] = _then(getattr(cls, step), getattr(cls, end), module)
    return wrappers


def _then(step: Callable, end: Callable, module: Any) -> Callable:
    def run(*args, **kwargs):
        output = step(module, *args, **kwargs)
        ended = end(module, output)
        return output if ended is None else ended
    return run


class EpochOutputs:
    """The outputs ``training_epoch_end`` / ``validation_epoch_end`` get, as Lightning 1.x
    passed them: one entry per batch whose step returned something (``None`` is dropped)."""

    def __init__(self, module: Any):
        self.module = module
        self.wanted = {phase: overrides(module, hook) for phase, hook in EPOCH_END.items()}

    def collector(self, phase: str) -> Optional[List[Any]]:
        """A list to append the phase's outputs to, or None when no hook wants them."""
        return [] if self.wanted[phase] else None

    @staticmethod
    def add(collected: Optional[List[Any]], output: Any, training: bool) -> None:
        if collected is None or output is None:
            return
        entry = training_entry(output) if training else output
        if entry is not None:
            collected.append(entry)

    def end(self, phase: str, collected: Optional[List[Any]]) -> Dict[str, float]:
        """Calls the phase's epoch-end hook (training: only with outputs, as 1.x did).

        Returns metrics for the call's results: Lightning 1.6+ wants ``None`` (values go
        through ``self.log``), but Ray 1.12 reported what the hook returned, a dict of
        metrics or a loss tensor, so those are merged into the results as 1.12 read them.
        """
        if collected is None or (phase == "train" and not collected):
            return {}
        hook = EPOCH_END[phase]
        device = getattr(self.module, "device", None)
        if isinstance(device, torch.device) and device.type != "cpu":  # restored from a commit
            collected = map_tensors(collected, lambda tensor: tensor.to(device))
        returned = getattr(self.module, hook)(collected)
        if returned is None:
            return {}
        if isinstance(returned, torch.Tensor) and returned.numel() == 1:
            return {"train_loss" if phase == "train" else "val_loss": float(returned.item())}
        if isinstance(returned, Mapping):
            return {key: value if key == NUM_SAMPLES else float(value)  # read once a call
                    for key, value in scalars(returned).items()}
        raise ConfigError(f"{type(self.module).__name__}.{hook} returned "
                          f"{type(returned).__name__}; it must return None and log values with "
                          "self.log (Lightning 1.6+), or, as Ray 1.12 read it, a dict of metrics "
                          "or a one-element loss tensor.")


def training_entry(output: Any) -> Optional[Dict[str, Any]]:
    """A training step's output as 1.x stored it: a dict with the loss detached (a bare
    tensor becomes ``{"loss": tensor}``; an empty dict is dropped)."""
    if isinstance(output, torch.Tensor):
        return {"loss": output.detach()}
    if isinstance(output, Mapping):
        entry = {k: v for k, v in output.items() if k != "hiddens"}
        if isinstance(entry.get("loss"), torch.Tensor):
            entry["loss"] = entry["loss"].detach()
        return entry or None
    return None
