"""One rank's piece of a sharded tensor, and a new piece cut from old ones.

A sharded commit stores, for each sharded tensor, the rank's local rows with the global
shape and the offset where they start (the layout torch's ``DTensor`` reports, the same
chunk description ``torch.distributed.checkpoint`` writes). Restoring at the same world
size takes a rank's own chunk back whole; at another world size (or from a full,
unsharded checkpoint, which is one chunk at offset 0) each rank copies the overlap of every
old chunk with its new piece, so no rank ever builds the full tensor. Pure torch, no
process group.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence, Tuple

import torch

from raysgd.errors import CheckpointError
from raysgd.state.packing import PACKED, view_tensor

MARK = "__raysgd_chunk__"


def make_chunk(local: torch.Tensor, shape: Sequence[int], offset: Sequence[int]) -> dict:
    """A chunk of a tensor of global ``shape`` whose rows start at ``offset``."""
    return {MARK: True, "data": local, "shape": tuple(shape), "offset": tuple(offset)}


def is_chunk(value: Any) -> bool:
    return isinstance(value, dict) and value.get(MARK) is True


def as_tensor(data: Any) -> torch.Tensor:
    """A tensor or a packed one (``raysgd.state.packing``), the latter viewed without copying."""
    return view_tensor(data) if isinstance(data, PACKED) else data


def _pieces(sources: Iterable[Any]):
    """``(tensor, offset)`` per source: chunks as they are, a plain tensor as the whole."""
    for source in sources:
        if is_chunk(source):
            yield source["shape"], as_tensor(source["data"]), source["offset"]
        else:
            tensor = as_tensor(source)
            yield tuple(tensor.shape), tensor, (0,) * tensor.dim()


def assemble(shape: Sequence[int], local_shape: Sequence[int], offset: Sequence[int],
             sources: Iterable[Any], name: str = "tensor") -> torch.Tensor:
    """The piece ``[offset, offset + local_shape)`` of a tensor of global ``shape``, copied
    from the overlapping parts of ``sources`` (chunks or whole tensors)."""
    out, covered = None, 0
    for src_shape, data, src_offset in _pieces(sources):
        if tuple(src_shape) != tuple(shape):
            raise CheckpointError(f"{name} has shape {tuple(src_shape)} in the checkpoint but "
                                  f"{tuple(shape)} in the model; load it into the same model.")
        overlap = _overlap(local_shape, offset, data.shape, src_offset)
        if overlap is None:
            continue
        dst, src = overlap
        if out is None:
            if dst == tuple(slice(0, n) for n in local_shape) and data.shape == tuple(local_shape):
                return data.clone()  # the rank's own chunk: nothing to cut
            out = torch.empty(tuple(local_shape), dtype=data.dtype)
        out[dst] = data[src]
        covered += _numel(dst)
    if out is None:
        out = torch.empty(0)
    if covered != _numel(tuple(slice(0, n) for n in local_shape)):
        raise CheckpointError(f"The commit does not cover all of {name} (shape {tuple(shape)}); "
                              "a shard is missing.")
    return out


def _overlap(local_shape: Sequence[int], offset: Sequence[int], src_shape: Sequence[int],
             src_offset: Sequence[int]) -> Any:
    """Slices (into the new piece, into the source) of their common box, or None."""
    dst, src = [], []
    for n, start, m, src_start in zip(local_shape, offset, src_shape, src_offset):
        low, high = max(start, src_start), min(start + n, src_start + m)
        if high <= low and n > 0:
            return None
        dst.append(slice(low - start, max(high, low) - start))
        src.append(slice(low - src_start, max(high, low) - src_start))
    return tuple(dst), tuple(src)


def _numel(box: Tuple[slice, ...]) -> int:
    total = 1
    for piece in box:
        total *= piece.stop - piece.start
    return total
