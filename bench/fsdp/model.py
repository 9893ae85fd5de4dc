"""The FSDP benchmark's workload: residual MLP blocks trained with Adam on synthetic data."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset


class Block(nn.Module):
    """``x + relu(W x)``: one FSDP unit."""

    def __init__(self, width: int):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


@dataclass(frozen=True)
class Size:
    width: int
    depth: int
    samples: int
    batch: int  # global
    epochs: int  # the first is warm-up

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(*[Block(self.width) for _ in range(self.depth)],
                             nn.Linear(self.width, 1))

    def data(self) -> TensorDataset:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(self.samples, self.width, generator=g)
        return TensorDataset(x, x[:, :8].sum(dim=1, keepdim=True).tanh())

    @property
    def param_bytes(self) -> int:
        return 4 * (self.depth * (self.width * self.width + self.width) + self.width + 1)


# "memory": a model whose state dwarfs a process's own overhead (~200 MB of libraries,
# buffers and caches that appear with the first steps), trained for a few steps only.
# "gpu": one rank on a GPU, large enough that a step is more than kernel launches.
SIZES = {"quick": Size(128, 4, 512, 64, 2), "full": Size(768, 6, 2048, 64, 4),
         "memory": Size(2048, 24, 256, 64, 2), "gpu": Size(4096, 8, 32768, 1024, 4)}


def status_bytes(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> int:
    """Reset this process's peak RSS; returns the RSS now (the baseline)."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return status_bytes("VmRSS")


def tensor_bytes(obj) -> int:
    """The bytes of every tensor inside nested dicts, lists and tuples."""
    if hasattr(obj, "element_size"):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0
