"""The workloads every variant trains: same model, data, batch and epochs.

Data is synthetic and in memory (seeded, so every process builds the same
tensors). This module imports only torch: importing ``raysgd`` would import Ray
and charge its start-up to the baseline variants. ``batch_size`` is the *global* batch: 2-worker variants give each
worker half of it, single-process variants use all of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Tuple

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODES = ("quick", "full")


@dataclass(frozen=True)
class Workload:
    """One model + synthetic data set + schedule; everything a variant needs."""

    name: str
    make_model: Callable[[], nn.Module]
    input_shape: Tuple[int, ...]
    num_samples: int
    batch_size: int
    epochs: int
    lr: float = 0.05
    num_classes: int = 10
    adam: bool = False  # fused Adam (state: twice the parameters) instead of SGD with momentum

    def __post_init__(self):
        if self.num_samples % self.batch_size or self.batch_size % 2:
            raise ValueError(f"{self.name}: num_samples must be a multiple of an even batch_size")
        if self.epochs < 2:
            raise ValueError(f"{self.name}: needs >= 2 epochs (the first one is warm-up)")

    def dataset(self) -> TensorDataset:
        gen = torch.Generator().manual_seed(0)
        features = torch.randn((self.num_samples, *self.input_shape), generator=gen)
        labels = torch.randint(0, self.num_classes, (self.num_samples,), generator=gen)
        return TensorDataset(features, labels)

    def loader(self, batch_size: int) -> DataLoader:
        """A shuffling loader over the whole data set (variants shard it themselves)."""
        return DataLoader(self.dataset(), batch_size=batch_size, shuffle=True)

    def model(self) -> nn.Module:
        torch.manual_seed(0)
        return self.make_model()

    def optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        if self.adam:  # fused: the state of the default (foreach) Adam, a step several
            # times faster on a CPU (about 0.3 s instead of 2 s for 134 M parameters)
            return torch.optim.Adam(model.parameters(), lr=self.lr, fused=True)
        return torch.optim.SGD(model.parameters(), lr=self.lr, momentum=0.9)

    @staticmethod
    def criterion() -> nn.Module:
        return nn.CrossEntropyLoss()


def mlp(width: int, depth: int, in_features: int, num_classes: int = 10) -> nn.Sequential:
    """``depth`` hidden Linear+ReLU layers of ``width`` units."""
    layers, size = [], in_features
    for _ in range(depth):
        layers += [nn.Linear(size, width), nn.ReLU()]
        size = width
    layers.append(nn.Linear(size, num_classes))
    return nn.Sequential(*layers)


class ResidualBlock(nn.Module):
    """Two 3x3 conv+BN layers plus a (projected when the shape changes) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(planes), nn.ReLU(),
            nn.Conv2d(planes, planes, 3, padding=1, bias=False), nn.BatchNorm2d(planes))
        self.shortcut = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


class SmallResNet(nn.Module):
    """A CIFAR-shaped ResNet (3x32x32 in), one residual block per stage (16/32/64 channels).

    ``raysgd.torch.resnet.ResNet18`` (64..512 channels) needs seconds per batch on one
    CPU thread, too slow to run every variant several times.
    """

    def __init__(self, widths=(16, 32, 64), num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, in_planes = [], widths[0]
        for index, planes in enumerate(widths):
            stages.append(ResidualBlock(in_planes, planes, stride=1 if index == 0 else 2))
            in_planes = planes
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(in_planes, num_classes))

    def forward(self, x):
        return self.head(self.stages(self.stem(x)))


_WORKLOADS: Dict[Tuple[str, str], Workload] = {
    ("mlp", "quick"): Workload("mlp", lambda: mlp(128, 2, 64), (64,),
                               num_samples=2048, batch_size=256, epochs=2),
    ("mlp", "full"): Workload("mlp", lambda: mlp(1024, 2, 512), (512,),
                              num_samples=16384, batch_size=256, epochs=4),
    ("resnet", "quick"): Workload("resnet", SmallResNet, (3, 32, 32),
                                  num_samples=256, batch_size=64, epochs=2),
    ("resnet", "full"): Workload("resnet", SmallResNet, (3, 32, 32),
                                 num_samples=2048, batch_size=64, epochs=3),
}


def _tax(name: str, width: int, in_features: int, samples: int, batch: int,
         epochs: int) -> Workload:
    """A size of ``python -m bench.tax``: ``mlp(width, 2, in_features)`` trained with Adam."""
    return Workload(name, lambda: mlp(width, 2, in_features), (in_features,),
                    num_samples=samples, batch_size=batch, epochs=epochs, lr=1e-3, adam=True)


# The tax benchmark's sizes (bench/tax): small is the full mlp above with Adam (19 MB of
# parameters and Adam state), medium about 100 MB, large 1.6 GB (two 8192-wide layers).
_WORKLOADS.update({
    ("tax_small", "full"): _tax("tax_small", 1024, 512, 16384, 256, 4),
    ("tax_medium", "full"): _tax("tax_medium", 2048, 2048, 4096, 64, 3),
    ("tax_large", "full"): _tax("tax_large", 8192, 8192, 32, 8, 3),
    ("tax_small", "quick"): _tax("tax_small", 128, 64, 2048, 256, 2),
    ("tax_medium", "quick"): _tax("tax_medium", 256, 256, 1024, 128, 2),
    ("tax_large", "quick"): _tax("tax_large", 512, 512, 512, 64, 2),
})

NAMES = sorted({name for name, _ in _WORKLOADS})


def get_workload(name: str, mode: str) -> Workload:
    """The workload ``name`` (``mlp``, ``resnet``, ``tax_*``) sized for ``mode`` (quick/full)."""
    try:
        return _WORKLOADS[(name, mode)]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}/{mode!r}; choose from {sorted(_WORKLOADS)}")
