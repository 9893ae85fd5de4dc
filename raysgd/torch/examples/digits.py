"""scikit-learn's handwritten digits: the offline data set the examples train on, and a small
CNN that classifies them (``examples/digits_demo.py`` trains it; the DCGAN uses it as a judge)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from raysgd.torch.examples._cluster import require


def digits_datasets(seed: int = 0):
    """(train, validation) TensorDatasets of 1x8x8 images scaled to [0, 1], split 80/20.

    The 1,797 digits ship with scikit-learn, so nothing is downloaded."""
    datasets = require("sklearn.datasets", "scikit-learn (or: pip install 'raysgd[demo]')",
                       "The digits data set")
    digits = datasets.load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(labels))
    train, val = order[:cut], order[cut:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


class DigitsNet(nn.Module):
    """Two 3x3 convolutions, a 2x2 max-pool and two linear layers: 8x8 digits -> 10 scores."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(width * 16, 64), nn.ReLU(),
                                  nn.Linear(64, 10))

    def forward(self, x):
        return self.head(self.features(x))
