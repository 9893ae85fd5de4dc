"""Sharded models and optimizers to and from torch's distributed checkpoint format (DCP).

The state is ``{"models": ..., "optimizers": ...}`` as
``torch.distributed.checkpoint.state_dict.get_state_dict`` gives it for the registered
models (as one ``ModuleList``, so their parameters are named ``0.<name>``, ``1.<name>``)
and optimizers: fully qualified names, so any world size and any sharding reads it back.
Saving and loading are collectives: every rank calls them at the same point.

:func:`save` with a ``group`` is ``dcp.async_save``: the state is copied to CPU memory on
the caller's thread (the only part on the training path), and DCP plans and writes it from
a thread of its own, on a process group of its own (``checkpoint_group``), so its
collectives never interleave with training's. At most one write is in flight per rank: the
next save waits for it (back-pressure, every rank alike, so their collectives stay in
step). Without a group it is ``dcp.save``, in place; :func:`writes_async` chooses.

``get_state_dict`` gives an optimizer that has not stepped yet a state by stepping it once
with zero gradients and no learning rate (Adam's ``step`` becomes 1). That state is saved as
is, but such optimizers are named in what :func:`save` returns, and :func:`load` empties
their state again, so a checkpoint written before the first step changes nothing.
"""
from __future__ import annotations

import shutil
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.dirblob import DirBlob, unpack_dir

def writes_async(choice: Optional[bool], device_type: str) -> bool:
    """``FSDP(async_checkpoints=...)``; None: in the background on GPUs, where the copy to
    host memory is the only part on the training path, in place on CPUs, where writing is
    CPU work either way and the background copy only adds to it (measured on 2 cores: a
    checkpoint every 20 steps added 8.2 % to an epoch's CPU in the background, 3.8 % in
    place; bench/README.md)."""
    return device_type == "cuda" if choice is None else choice


def _state(models: List[nn.Module], optimizers: List[Any]):
    container = nn.ModuleList(models)  # holds references only; the models stay as they are
    model_state, optim_state = get_state_dict(container, optimizers)
    return container, {"models": model_state, "optimizers": optim_state}


@dataclass
class ShardWrite:
    """A save under way: ``extra`` is what :func:`load` needs besides the files; ``wait()``
    returns once the files are complete (raises what the write raised)."""

    extra: Dict[str, Any]
    future: Optional[Future] = None

    def wait(self, timeout_s: Optional[float] = None) -> None:
        if self.future is not None:
            self.future.result(timeout_s)


def checkpoint_group() -> Optional[Any]:
    """A gloo group beside training's (a collective: every rank creates it at the same
    point), or None without a process group."""
    return dist.new_group(backend="gloo") if dist.is_initialized() else None


def save(models: List[nn.Module], optimizers: List[Any], path: str,
         group: Optional[Any] = None, previous: Optional[ShardWrite] = None) -> ShardWrite:
    """Start writing this rank's shards into ``path`` (a local directory; rank 0 adds DCP's
    metadata) after ``previous`` finished; returns as soon as the state is copied."""
    if previous is not None:
        previous.wait()
    fresh = [index for index, optimizer in enumerate(optimizers) if not optimizer.state]
    _, state = _state(models, optimizers)
    # Unsynced: these are staged files, synced on the driver's writer thread where they are
    # placed in a local run directory (an upload needs no sync). Syncing here cost the
    # training thread about 20 ms of a 80 ms in-place write (2 ranks, 40 MiB, measured).
    writer = FileSystemWriter(path, sync_files=False)
    if group is None:  # no process group, or writes in place (writes_async): here and now
        with checkpoint_io.without_crc():
            dcp.save(state, storage_writer=writer)
        future = None
    else:
        future = dcp.async_save(state, storage_writer=writer, process_group=group)
    _clear(optimizers, fresh)  # the state was copied: the write does not see this
    return ShardWrite({"fresh_optimizers": fresh}, future)


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
