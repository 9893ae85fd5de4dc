"""Variant: the hand-written ``torch.amp`` loop in one process (no raysgd, no Ray)."""
from __future__ import annotations

import contextlib
from typing import List, Optional

import torch

from bench.gpu.child import parse_args, profiled, report, setup, timed
from bench.gpu.workload import Batch, GpuWorkload

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class AmpLoop:
    """Model, optimizer and, for fp16 only, a GradScaler: what a user would write by hand."""

    def __init__(self, workload: GpuWorkload, precision: str, device: torch.device):
        self.model = workload.model().to(device).train()
        self.optimizer = workload.optimizer(self.model)
        self.criterion = workload.criterion().to(device)
        self.device_type = device.type
        self.dtype = DTYPES.get(precision)
        # bf16 keeps fp32's exponent range, so only fp16 needs loss scaling.
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)

    def step(self, features: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = self.criterion(self.model(features), target)
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return loss

    def run(self, pool: List[Batch], start: int, count: int) -> Optional[torch.Tensor]:
        """``count`` steps over ``pool``, cycling from batch ``start``; the last loss."""
        loss = None
        for index in range(start, start + count):
            loss = self.step(*pool[index % len(pool)])
        return loss


def main() -> None:
    args = parse_args(__doc__)
    workload, device = setup(args)
    pool = workload.pool(device)
    loop = AmpLoop(workload, args.precision, device)
    warmup, steps = workload.warmup_steps, workload.timed_steps
    loop.run(pool, 0, warmup)
    seconds, loss = timed(lambda: loop.run(pool, warmup, steps), device)
    extra = {"profile": profiled(lambda: loop.run(pool, warmup + steps, args.profile_steps),
                                 device, args.profile_steps)} if args.profile_steps else {}
    report(workload, args.precision, device, seconds, train_loss=float(loss.detach()),
           loss_scale=loop.scaler.get_scale() if loop.scaler else None, **extra)


if __name__ == "__main__":
    main()
