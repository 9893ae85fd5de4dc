"""The hand-written loop of the peers' chaos runs: endless epochs from any step.

A run resumed from a checkpoint taken after ``step`` steps starts in that step's epoch
(the sampler shuffled as it was) and skips the batches it had trained.
"""
from __future__ import annotations

import itertools
import os
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader

from bench.loop import train_epoch


def train_steps(model: nn.Module, optimizer, criterion: nn.Module, loader: DataLoader,
                step: int, on_step: Callable[[int], None]) -> None:
    """Train from global step ``step`` until the process is stopped; ``on_step(step)``
    after each optimizer step, with the global step count."""
    epoch = step // len(loader)

    def advance() -> None:
        nonlocal step
        step += 1
        on_step(step)

    while True:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        done = step - epoch * len(loader)  # batches of this epoch trained before a resume
        train_epoch(model, optimizer, criterion, itertools.islice(loader, done, None),
                    on_step=advance)
        epoch += 1


def save_state(path: str, model: nn.Module, optimizer, step: int, **extra) -> None:
    """Model, optimizer, step (and ``extra`` entries) in one file, replaced atomically."""
    tmp = f"{path}.{os.getpid()}.tmp"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "step": step, **extra}, tmp)
    os.replace(tmp, path)


def load_state(path: str, model: nn.Module, optimizer) -> int:
    """The step of the state in ``path`` loaded into ``model`` and ``optimizer``; 0 without
    one."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return state["step"]
