"""Sharded models and optimizers to and from torch's distributed checkpoint format (DCP).

The state is ``{"models": ..., "optimizers": ...}`` as
``torch.distributed.checkpoint.state_dict.get_state_dict`` gives it for the registered
models (as one ``ModuleList``, so their parameters are named ``0.<name>``, ``1.<name>``)
and optimizers: fully qualified names, so any world size and any sharding reads it back.
Saving and loading are collectives: every rank calls them at the same point.

``get_state_dict`` gives an optimizer that has not stepped yet a state by stepping it once
with zero gradients and no learning rate (Adam's ``step`` becomes 1). That state is saved as
is, but such optimizers are named in what :func:`save` returns, and :func:`load` empties
their state again, so a checkpoint written before the first step changes nothing.
"""
from __future__ import annotations

import shutil
import tempfile
from typing import Any, Dict, List

import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from raysgd.state.dirblob import DirBlob, unpack_dir


def _state(models: List[nn.Module], optimizers: List[Any]):
    container = nn.ModuleList(models)  # holds references only; the models stay as they are
    model_state, optim_state = get_state_dict(container, optimizers)
    return container, {"models": model_state, "optimizers": optim_state}


def save(models: List[nn.Module], optimizers: List[Any], path: str) -> Dict[str, Any]:
    """This rank's shards into ``path`` (a local directory; rank 0 adds DCP's metadata).
    Returns what :func:`load` needs besides the files."""
    fresh = [index for index, optimizer in enumerate(optimizers) if not optimizer.state]
    _, state = _state(models, optimizers)
    dcp.save(state, checkpoint_id=path)
    _clear(optimizers, fresh)
    return {"fresh_optimizers": fresh}


def load(models: List[nn.Module], optimizers: List[Any], files: DirBlob,
         fresh_optimizers: List[int] = ()) -> None:
    """Load a DCP checkpoint (every rank's files) into the sharded models and optimizers:
    each rank reads the pieces of its own shards, whatever the world size that wrote it."""
    path = tempfile.mkdtemp(prefix="raysgd-dcp-load-")
    try:
        unpack_dir(files, path)
        container, state = _state(models, optimizers)
        dcp.load(state, checkpoint_id=path)
        set_state_dict(container, optimizers, model_state_dict=state["models"],
                       optim_state_dict=state["optimizers"])
    finally:
        shutil.rmtree(path, ignore_errors=True)
    _clear(optimizers, fresh_optimizers)


def _clear(optimizers: List[Any], indices: List[int]) -> None:
    """Back to no state: these optimizers had not stepped when the state was taken."""
    for index in indices:
        optimizers[index].state.clear()
