"""Host copies of a state's tensors, for a commit.

A GPU tensor copied to ordinary (pageable) host memory is copied while the CPU waits, one
tensor after the other, at a fraction of the bus's speed. Here each GPU tensor is copied
without waiting, into pinned memory (which torch allocates for a non-blocking copy to the
CPU, and keeps cached for the next commit: up to about twice a rank's state stays pinned),
and the CPU waits once, after the last copy. ``python -m bench.gpu.commit_copy`` measures
both ways on a GPU.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Set

import torch

from raysgd.worker.batches import map_tensors


def host_copies(state: Any, view: Optional[Callable[[torch.Tensor], bool]] = None) -> Any:
    """``state`` with every tensor replaced by a detached copy in host memory (never an
    alias of a live CPU tensor), ready to read when this returns; but a CPU tensor for which
    ``view`` says so stays a detached view of itself (``raysgd.worker.live_state``)."""
    devices: Set[torch.device] = set()

    def copy(tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if tensor.is_cuda:
            devices.add(tensor.device)
            return tensor.to("cpu", non_blocking=True)
        if view is not None and view(tensor):
            return tensor
        return tensor.to("cpu", copy=True)

    copies = map_tensors(state, copy)
    for device in devices:  # the copies were queued on each device's current stream
        torch.cuda.current_stream(device).synchronize()
    return copies
