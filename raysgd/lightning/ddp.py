"""Distributed plumbing of the Lightning adapter: the step dispatcher DDP wraps, and the
collectives used when DDP does not sync (manual optimization, ``wrap_ddp=False``).

Every tensor a collective sends lives on the device of the data it is about (the
parameters, or the operator's device), so NCCL works as well as gloo. All of it is a
no-op at world size 1 or without a process group.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional

import torch
import torch.distributed as dist
from torch import nn


class StepDispatcher(nn.Module):
    """``forward(*args)`` is the module's ``training_step(*args)``.

    DDP's gradient hooks fire only for a backward that follows its own
    ``forward``, so the training step has to run as the forward of the module
    DDP wraps (Lightning's own strategies do the same). The LightningModule is
    the only child, so parameters and buffers are exactly the module's.
    """

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module.training_step(*args, **kwargs)


def active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def broadcast_module(module: nn.Module) -> None:
    """Give every rank rank 0's parameters and buffers (what DDP does when it wraps)."""
    if not active():
        return
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)


def optimizer_params(optimizer) -> List[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def average_gradients(params: Iterable[torch.Tensor]) -> None:
    """All-reduce the gradients of ``params`` to their mean over the workers.

    A parameter with no gradient on some rank (toggled off, unused this step)
    joins with zeros when another rank has one, and keeps ``grad=None`` when
    no rank has one, so every rank ends with the same gradients.
    """
    if not active():
        return
    params = list(params)
    if not params:
        return
    have = torch.tensor([p.grad is not None for p in params], dtype=torch.int32,
                        device=params[0].device)
    dist.all_reduce(have, op=dist.ReduceOp.MAX)
    chosen = [p for p, flag in zip(params, have.tolist()) if flag]
    if not chosen:
        return
    for p in chosen:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in chosen]
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for grad in grads:
        count = grad.numel()
        grad.copy_(flat[offset:offset + count].view_as(grad))
        offset += count


def average_on_step(optimizer: Any, sync: Callable[[Any], None],
                    forget: Callable[[Any], None]) -> None:
    """Make every ``optimizer.step()`` average the gradients first, also a raw one.

    ``self.optimizers(use_pl_optimizer=False)`` and ``self.trainer.optimizers``
    hand out the torch optimizers themselves; a step hook averages for them.
    ``sync`` averages once per step (a no-op when DDP or the wrapper already
    did); ``forget`` clears that once-per-step mark after the step. A step with
    a closure averages after each call of the closure, which makes the gradients.
    """
    if not hasattr(optimizer, "register_step_pre_hook"):
        return

    def before(opt, args, kwargs):  # args[0] is the optimizer itself
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            sync(opt)
            return None

        def averaged():
            result = closure()
            forget(opt)
            sync(opt)
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": averaged}
        return (args[0], averaged, *args[2:]), kwargs

    optimizer.register_step_pre_hook(before)
    optimizer.register_step_post_hook(lambda opt, args, kwargs: forget(opt))


def average_value(value: Optional[float], weight: float,
                  device: Optional[torch.device] = None) -> Optional[float]:
    """``value`` averaged over the workers that have one, weighted; None when none has one."""
    if not active():
        return value
    have = value is not None
    data = torch.tensor([value * weight if have else 0.0, weight if have else 0.0, float(have)],
                        dtype=torch.float64, device=device)
    dist.all_reduce(data)
    if data[2].item() == 0:
        return None
    return (data[0] / data[1]).item() if data[1].item() > 0 else None


def gather(data: Any, device: torch.device) -> Any:
    """``LightningModule.all_gather``: tensors (and numbers) stacked over the workers.

    Data is moved to ``device`` first (as Lightning does), so a CPU tensor works
    under NCCL. At world size 1 it comes back as is, as Lightning's
    single-device strategy does; dicts, lists and tuples keep their structure.
    """
    if isinstance(data, dict):
        return type(data)((key, gather(value, device)) for key, value in data.items())
    if isinstance(data, (list, tuple)):
        return type(data)(gather(value, device) for value in data)
    data = torch.as_tensor(data, device=device)
    if not active():
        return data
    data = data.contiguous()
    parts = [torch.empty_like(data) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, data)
    return torch.stack(parts)
