"""The hand-written training loop shared by the torchrun, Ray Train and plain variants."""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn
from torch.utils.data import DataLoader

from bench.child import Figures


def train_epoch(model: nn.Module, optimizer, criterion: nn.Module, loader: DataLoader,
                on_step: Optional[Callable[[], None]] = None,
                device: Optional[torch.device] = None) -> None:
    """One pass over ``loader``: forward, loss, backward, step; nothing else (each batch
    moved to ``device`` first, when one is given)."""
    model.train()
    for features, target in loader:
        if device is not None:
            features, target = features.to(device), target.to(device)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(features), target)
        loss.backward()
        optimizer.step()
        if on_step is not None:
            on_step()


def run_epochs(model: nn.Module, optimizer, criterion: nn.Module, loader: DataLoader,
               figures: Figures, device: Optional[torch.device] = None,
               on_epoch_end: Optional[Callable[[int], None]] = None) -> None:
    """First epoch (records the first step), then the steady epochs (timed);
    ``on_epoch_end(epoch)`` after each epoch, the first included, if given."""
    epochs = figures.workload.epochs
    for epoch in range(epochs):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if epoch == 1:
            figures.steady_start()
        train_epoch(model, optimizer, criterion, loader,
                    on_step=figures.step_done if epoch == 0 else None, device=device)
        if on_epoch_end is not None:
            on_epoch_end(epoch)
    figures.steady_end(epochs - 1)
