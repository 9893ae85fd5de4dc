"""Tensors as raw numpy bytes for the object store, and back.

Ray pickles a torch tensor by copying its storage into the pickle stream,
but writes a numpy array's buffer straight into shared memory. A commit of a
12 MB model state takes about 30 ms to store as tensors and under 10 ms as
numpy bytes (measured on the bench MLP), and the worker pays it on every
commit, so snapshots travel packed. Any dtype packs (bf16 has no numpy
twin): the bytes are reinterpreted as uint8 and the dtype and shape ride along.

A between-call commit's tensors may instead live in a slab the driver holds
(:class:`raysgd.state.slab.SlabTensor`, same interface); every function here takes both, and
whatever copies a slab's bytes checks afterwards that no newer commit overwrote them.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Tuple

import numpy as np
import torch

from raysgd.state.slab import SlabTensor, reading


@dataclass(frozen=True)
class PackedTensor:
    data: np.ndarray  # uint8 bytes of a contiguous tensor
    dtype: torch.dtype
    shape: Tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    slab = None  # bytes Ray stores never change (a slab's may: ``SlabTensor.verify``)

    def verify(self) -> None:
        pass


PACKED = (PackedTensor, SlabTensor)


def map_leaves(obj: Any, kind: Any, fn) -> Any:
    """``obj`` (nested dicts, lists, tuples) with each leaf of type ``kind`` replaced by
    ``fn(leaf)``."""
    if isinstance(obj, kind):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((key, map_leaves(value, kind, fn)) for key, value in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_leaves(value, kind, fn) for value in obj)
    return obj


def leaves(obj: Any, kind: Any) -> Iterator[Any]:
    """The values inside ``obj`` of type ``kind`` (a type or a tuple of them) or, when
    ``kind`` is a predicate, for which it holds; in :func:`map_leaves`' order, a match not
    searched further."""
    if isinstance(kind, (type, tuple)):
        return _leaves(obj, lambda value: isinstance(value, kind))
    return _leaves(obj, kind)


def _leaves(obj: Any, match) -> Iterator[Any]:
    if match(obj):
        yield obj
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from _leaves(value, match)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _leaves(value, match)


def _pack(tensor: torch.Tensor) -> Any:
    if tensor.layout is not torch.strided or tensor.device.type != "cpu":
        return tensor  # sparse or still on a device: left to plain pickling
    flat = tensor.detach().contiguous().reshape(-1)
    return PackedTensor(flat.view(torch.uint8).numpy(), tensor.dtype, tuple(tensor.shape))


def _unpack(packed: PackedTensor) -> torch.Tensor:
    # Copy: the array may be a read-only view of shared memory, and optimizer
    # state loaded from it would otherwise be updated in place there.
    data = torch.from_numpy(np.array(packed.data, copy=True))
    return data.view(packed.dtype).reshape(packed.shape)


def view_tensor(packed: Any) -> torch.Tensor:
    """The tensor a :class:`PackedTensor` holds, viewed without copying: for reading only
    (the bytes may be read-only shared memory)."""
    with warnings.catch_warnings():  # torch warns about non-writable arrays; nobody writes
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(packed.data)
    return flat.view(packed.dtype).reshape(packed.shape)


def pack_tensors(obj: Any) -> Any:
    """Every CPU tensor inside nested dicts/lists/tuples as a :class:`PackedTensor` (no copy)."""
    return map_leaves(obj, torch.Tensor, _pack)


def unpack_tensors(obj: Any) -> Any:
    """The inverse of :func:`pack_tensors`, as fresh writable tensors."""
    with reading():
        out = map_leaves(obj, PACKED, _unpack)
    verify_packed(obj)
    return out


def view_tensors(obj: Any) -> Any:
    """:func:`unpack_tensors` without the copies, for state that is only read (written out;
    the reader calls :func:`verify_packed` once it has read them)."""
    with reading():
        return map_leaves(obj, PACKED, view_tensor)


def own_copies(obj: Any) -> Any:
    """``obj`` with every packed tensor's bytes copied (no longer a view of anything)."""
    def copy(packed: Any) -> PackedTensor:
        return PackedTensor(np.array(packed.data, copy=True), packed.dtype, packed.shape)

    with reading():
        out = map_leaves(obj, PACKED, copy)
    verify_packed(obj)
    return out


def verify_packed(obj: Any) -> None:
    """Raise :class:`raysgd.errors.SlabCommitLost` if a slab under ``obj`` was overwritten
    (after its views were read: what was read is then not one commit). Each slab is checked
    once: its header covers every tensor in it."""
    checked = set()
    for packed in leaves(obj, SlabTensor):
        if packed.slab not in checked:
            checked.add(packed.slab)
            packed.verify()
