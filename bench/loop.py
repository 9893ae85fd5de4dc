"""The hand-written training loop shared by the torchrun, Ray Train and plain variants."""
from __future__ import annotations

from typing import Callable, Optional

from torch import nn
from torch.utils.data import DataLoader

from bench.child import Figures


def train_epoch(model: nn.Module, optimizer, criterion: nn.Module, loader: DataLoader,
                on_step: Optional[Callable[[], None]] = None) -> None:
    """One pass over ``loader``: forward, loss, backward, step; nothing else."""
    model.train()
    for features, target in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(features), target)
        loss.backward()
        optimizer.step()
        if on_step is not None:
            on_step()


def run_epochs(model: nn.Module, optimizer, criterion: nn.Module, loader: DataLoader,
               figures: Figures) -> None:
    """First epoch (records the first step), then the steady epochs (timed)."""
    epochs = figures.workload.epochs
    for epoch in range(epochs):
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        if epoch == 1:
            figures.steady_start()
        train_epoch(model, optimizer, criterion, loader,
                    on_step=figures.step_done if epoch == 0 else None)
    figures.steady_end(epochs - 1)
