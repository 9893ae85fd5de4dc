"""An ImageNet-style ResNet: 7x7 stride-2 stem, max-pool, bottleneck stages.

``raysgd.torch.resnet.ResNet50`` is the CIFAR variant (3x3 stride-1 stem, no
pool). At 224x224 it would cost about 16 times the FLOPs of the ResNet-50
whose throughput figures everyone quotes, so the GPU mode builds its own.
"""
from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn


def _conv_bn(in_ch: int, out_ch: int, kernel: int, stride: int = 1) -> List[nn.Module]:
    return [nn.Conv2d(in_ch, out_ch, kernel, stride=stride, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(out_ch)]


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided here, as in torchvision's "v1.5"), 1x1 expand x4."""

    def __init__(self, in_ch: int, width: int, stride: int):
        super().__init__()
        out_ch = 4 * width
        self.body = nn.Sequential(*_conv_bn(in_ch, width, 1), nn.ReLU(inplace=True),
                                  *_conv_bn(width, width, 3, stride), nn.ReLU(inplace=True),
                                  *_conv_bn(width, out_ch, 1))
        self.shortcut = (nn.Identity() if stride == 1 and in_ch == out_ch
                         else nn.Sequential(*_conv_bn(in_ch, out_ch, 1, stride)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ImageNetResNet(nn.Module):
    """``depths`` bottleneck blocks per stage; stage i has width ``base * 2**i``."""

    def __init__(self, depths: Sequence[int], base: int = 64, num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, base, 7, 2), nn.ReLU(inplace=True),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        blocks, in_ch = [], base
        for stage, depth in enumerate(depths):
            for index in range(depth):
                stride = 2 if stage > 0 and index == 0 else 1
                blocks.append(Bottleneck(in_ch, base * 2 ** stage, stride))
                in_ch = 4 * base * 2 ** stage
        self.stages = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(in_ch, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


def resnet50(num_classes: int = 1000) -> ImageNetResNet:
    """ResNet-50 for 3x224x224 inputs (25.6 M parameters with 1000 classes)."""
    return ImageNetResNet((3, 4, 6, 3), 64, num_classes)


def tiny_resnet(num_classes: int = 10) -> ImageNetResNet:
    """The same layout, one block per stage and 8..64 widths: a CPU smoke model."""
    return ImageNetResNet((1, 1, 1, 1), 8, num_classes)
