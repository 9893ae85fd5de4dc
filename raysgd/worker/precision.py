"""One precision object per worker, chosen once from ``use_fp16`` and the device.

Everything else calls the object (``autocast()``, ``backward(loss)``,
``step(optimizer)``) instead of testing a flag, so custom loops that use the
operator helpers get mixed precision for free.

==============  =======  ==========================================
``use_fp16``    device   engine
==============  =======  ==========================================
False           any      fp32, no-op
True            CUDA     fp16 autocast + ``torch.amp.GradScaler``
True            CPU      bf16 autocast (warned once: CPU has no fp16 autocast worth using)
"fp16"          any      fp16 autocast + GradScaler, on CPU too (slow there; for testing)
"bf16"          any      bf16 autocast, no scaler
"apex"          CUDA     NVIDIA Apex amp (only when ``apex.amp`` imports)
==============  =======  ==========================================

Loss scaling is the subtle part: ``backward`` scales, ``unscale_`` divides
an optimizer's gradients back (before clipping), ``step`` skips the update
when gradients overflowed. The scaler's ``update`` (which changes the scale)
is deferred to the next ``backward``, so several optimizers stepped after one
backward all see the scale their gradients were made with.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Mapping, Optional, Sequence

import torch

from raysgd.errors import ConfigError
from raysgd.worker.process_state import on_restore


class Precision:
    """fp32: every hook is the plain PyTorch call."""

    name = "fp32"

    def setup(self, models: list, optimizers: list):
        return models, optimizers

    def autocast(self):
        return contextlib.nullcontext()

    def backward(self, *losses: torch.Tensor) -> None:
        torch.autograd.backward(list(losses))

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step ``optimizer``; returns False when the step was skipped (overflow)."""
        optimizer.step()
        return True

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Make ``optimizer``'s gradients true gradients (before clipping); no-op unscaled."""

    @property
    def scale(self) -> Optional[float]:
        """The current loss scale, or None without loss scaling."""
        return None

    def state_dict(self) -> Dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class AutocastPrecision(Precision):
    """Autocast to ``dtype`` without loss scaling (bf16 keeps fp32's exponent range)."""

    def __init__(self, device_type: str, dtype: torch.dtype):
        self.device_type = device_type
        self.dtype = dtype
        self.name = str(dtype).replace("torch.", "")

    def autocast(self):
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


class Applied:
    """Whether a scaled step was applied (truthy) or skipped for an overflow (falsy).

    Read only when asked: the flags live on the GPU, and reading them waits for it."""

    __slots__ = ("_flags",)

    def __init__(self, flags: list):
        self._flags = flags

    def __bool__(self) -> bool:
        return not any(bool(flag) for flag in self._flags)

    def __eq__(self, other: Any) -> bool:
        return bool(self) == other if isinstance(other, bool) else NotImplemented

    def __hash__(self) -> int:
        return hash(bool(self))

    def __reduce__(self):
        return bool, (bool(self),)  # pickled (into a metric, say) as the plain bool

    def __repr__(self) -> str:
        return repr(bool(self))


class ScaledFp16Precision(AutocastPrecision):
    """fp16 autocast with dynamic loss scaling (``torch.amp.GradScaler``)."""

    def __init__(self, device_type: str = "cuda"):
        super().__init__(device_type, torch.float16)
        self.scaler = torch.amp.GradScaler(device_type)
        self._stepped = False  # an update is due before the next backward
        self._unscaled: set = set()

    def backward(self, *losses: torch.Tensor) -> None:
        self._update()
        torch.autograd.backward([self.scaler.scale(loss) for loss in losses])

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) not in self._unscaled:  # the scaler refuses a second unscale_
            self._unscaled.add(id(optimizer))
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> "Applied":
        self.scaler.step(optimizer)
        self._stepped = True
        self._unscaled.discard(id(optimizer))
        # GradScaler keeps per-optimizer overflow flags until update() (which adds other
        # optimizers' into them): copies, on the GPU, are this step's record.
        state = self.scaler._per_optimizer_states.get(id(optimizer), {})
        return Applied([flag.clone() for flag in state.get("found_inf_per_device", {}).values()])

    def _update(self) -> None:
        if self._stepped:
            self.scaler.update()
            self._stepped = False
            self._unscaled.clear()

    @property
    def scale(self) -> Optional[float]:
        return self.scaler.get_scale()

    def state_dict(self) -> Dict[str, Any]:
        self._update()
        return {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
            self._stepped = False
            self._unscaled.clear()


class ApexPrecision(Precision):
    """NVIDIA Apex amp, kept for legacy scripts; native amp is the supported path."""

    name = "apex"

    def __init__(self, apex_args: Optional[Mapping[str, Any]]):
        from apex import amp  # checked importable on the driver

        self._amp = amp
        self._apex_args = dict(apex_args or {})
        self._optimizers: Sequence[torch.optim.Optimizer] = ()

    def setup(self, models: list, optimizers: list):
        models, optimizers = self._amp.initialize(models, optimizers, **self._apex_args)
        self._optimizers = optimizers
        return list(models), list(optimizers)

    def backward(self, *losses: torch.Tensor) -> None:
        for loss in losses:
            with self._amp.scale_loss(loss, self._optimizers) as scaled:
                scaled.backward()

    def state_dict(self) -> Dict[str, Any]:
        return {"amp": self._amp.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("amp"):
            self._amp.load_state_dict(state["amp"])


_warned_cpu_fp16 = False


@on_restore
def reset_warnings() -> None:
    """Warn again, as a new process would (a pooled worker starting over for a new trainer)."""
    global _warned_cpu_fp16
    _warned_cpu_fp16 = False


def create_precision(use_fp16: Any, device: torch.device,
                     apex_args: Optional[Mapping[str, Any]] = None) -> Precision:
    """Resolve ``use_fp16`` for ``device`` into one precision object."""
    global _warned_cpu_fp16
    device_type = torch.device(device).type
    if use_fp16 is False:
        return Precision()
    if use_fp16 == "bf16":
        return AutocastPrecision(device_type, torch.bfloat16)
    if use_fp16 == "fp16":
        return ScaledFp16Precision(device_type)
    if use_fp16 is True:
        if device_type == "cuda":
            return ScaledFp16Precision(device_type)
        if not _warned_cpu_fp16:
            _warned_cpu_fp16 = True
            warnings.warn("use_fp16=True on CPU: using bf16 autocast instead of fp16 "
                          "(CPU fp16 autocast is slow and needs no GradScaler). "
                          "Pass use_fp16='bf16' to silence this warning.", stacklevel=2)
        return AutocastPrecision(device_type, torch.bfloat16)
    if use_fp16 == "apex":
        if device_type != "cuda":
            raise ConfigError("use_fp16='apex' needs CUDA; use use_fp16='bf16' on CPU.")
        return ApexPrecision(apex_args)
    raise ConfigError(f"use_fp16={use_fp16!r} is not valid; use False, True, 'fp16', 'bf16' "
                      "or 'apex'.")
