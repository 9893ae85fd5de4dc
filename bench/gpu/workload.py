"""The GPU mode's workload: model, synthetic device-resident batches, optimizer, schedule.

Imports only torch (see ``bench.gpu``), so the loop variant stays raysgd-free.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import torch
from torch import nn

from bench.gpu.models import resnet50, tiny_resnet

Batch = Tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class GpuWorkload:
    name: str
    make_model: Callable[[int], nn.Module]
    input_shape: Tuple[int, ...]
    num_classes: int
    batch_size: int
    warmup_steps: int
    timed_steps: int
    # A few distinct batches, reused cyclically: enough that no step sees the
    # same tensor twice in a row, few enough to fit next to the model.
    pool_batches: int = 4
    # Small enough that fp16 does not overflow on random labels, which would
    # make GradScaler skip steps (skipped steps are cheaper, flattering fp16).
    lr: float = 0.01

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return self.make_model(self.num_classes)

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=self.lr, momentum=0.9)

    @staticmethod
    def criterion() -> nn.Module:
        return nn.CrossEntropyLoss()

    def pool(self, device: torch.device) -> List[Batch]:
        """The synthetic batches, created on ``device`` so no step copies data."""
        gen = torch.Generator(device=device).manual_seed(0)
        shape = (self.batch_size, *self.input_shape)
        return [(torch.randn(shape, generator=gen, device=device),
                 torch.randint(0, self.num_classes, (self.batch_size,), generator=gen,
                               device=device))
                for _ in range(self.pool_batches)]


_BY_MODE = {
    "full": GpuWorkload("resnet50", resnet50, (3, 224, 224), 1000, batch_size=128,
                        warmup_steps=10, timed_steps=50),
    # CPU smoke: the same layout at toy size, just enough steps to run every path.
    "quick": GpuWorkload("tiny_resnet", tiny_resnet, (3, 32, 32), 10, batch_size=8,
                         warmup_steps=2, timed_steps=3),
}
MODES = tuple(_BY_MODE)


def get_workload(mode: str, warmup_steps: Optional[int] = None,
                 timed_steps: Optional[int] = None) -> GpuWorkload:
    """The workload for ``mode`` (quick/full), with the step counts overridden when given."""
    workload = _BY_MODE[mode]
    changes = {key: value for key, value in (("warmup_steps", warmup_steps),
                                             ("timed_steps", timed_steps)) if value is not None}
    for key, value in changes.items():
        if value < 1:
            raise ValueError(f"{key} must be >= 1, got {value}")
    return dataclasses.replace(workload, **changes)
