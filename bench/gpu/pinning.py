"""``python -m bench.gpu.pinning --way WAY [--state resnet50|mlp] [--rounds N]``: what would take
the first commits' pinning off the training thread (``bench/README.md``, "Where the GPU tax
goes": each of a process's first commits pins new host memory at 1.4-1.9 GB/s), measured on a
GPU before any of it is built. One way per process, so that each starts with torch's pinned
cache empty, as a rank does:

* ``per_tensor``: :func:`raysgd.worker.host_copy.host_copies`, a pinned block per tensor (today);
* ``slab``: one pinned block per commit, the tensors copied into views of it (:func:`slab_copies`);
* ``prepinned``: ``slab``, with three commits' blocks pinned and freed into torch's cache first
  (what a rank could do off the training thread while its first steps run);
* ``background``: does pinning on another thread hold up training? A stand-in step (bf16
  matrix products) timed on this thread, alone and while a thread pins three commits' worth.

Commits are taken as a trainer holds them: the last two stay alive. Run ``per_tensor`` again
with ``PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True,pinned_num_register_threads:8``
for torch's multi-threaded pinning. Prints one JSON line (``BENCH_RESULT``): each round's
milliseconds, so the cold rounds show apart from the warm ones.
"""
from __future__ import annotations

import argparse
import collections
import os
import statistics
import threading
import time
from typing import Any, Callable, Dict, List

import torch

from bench.child import emit
from bench.fsdp.model import tensor_bytes
from bench.gpu.commit_copy import training_state

WAYS = ("per_tensor", "slab", "prepinned", "background")
ALIGN = 256  # bytes: every view starts aligned for any dtype (and for the copy engines)


def _cuda_tensors(state: Any) -> List[torch.Tensor]:
    from raysgd.state.packing import leaves
    return [t.detach() for t in leaves(state, torch.Tensor) if t.is_cuda]


def slab_bytes(tensors: List[torch.Tensor]) -> int:
    """Bytes of one slab holding every tensor, each at an ``ALIGN``-byte boundary."""
    return sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for t in tensors)


def slab_views(slab: torch.Tensor, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Views of ``slab`` (uint8) shaped and typed as ``tensors``, one after the other."""
    views, offset = [], 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        views.append(slab[offset:offset + nbytes].view(tensor.dtype).view(tensor.shape))
        offset += -(-nbytes // ALIGN) * ALIGN
    return views


def slab_copies(tensors: List[torch.Tensor], pin: bool = True) -> List[torch.Tensor]:
    """Host copies of ``tensors`` in one (pinned) slab: non-blocking copies, one wait."""
    slab = torch.empty(slab_bytes(tensors), dtype=torch.uint8, pin_memory=pin)
    views = slab_views(slab, tensors)
    for view, tensor in zip(views, tensors):
        view.copy_(tensor, non_blocking=pin)
    if pin:
        torch.cuda.current_stream().synchronize()
    return views


def pin_slabs(tensors: List[torch.Tensor], count: int = 3) -> List[torch.Tensor]:
    """``count`` commits' worth of pinned slabs (two held plus one in flight)."""
    return [torch.empty(slab_bytes(tensors), dtype=torch.uint8, pin_memory=True)
            for _ in range(count)]


def _rounds(copy: Callable[[], Any], rounds: int) -> List[float]:
    held: collections.deque = collections.deque(maxlen=2)
    times = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start = time.perf_counter()
        held.append(copy())
        times.append((time.perf_counter() - start) * 1e3)
    return times


def _background(tensors: List[torch.Tensor], steps: int = 60) -> Dict[str, Any]:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

    def step_ms() -> float:
        start = time.perf_counter()
        for _ in range(4):
            a @ a
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    for _ in range(5):
        step_ms()
    alone = [step_ms() for _ in range(steps)]
    pinned = []

    def pin() -> None:
        start = time.perf_counter()
        pin_slabs(tensors)
        pinned.append((time.perf_counter() - start) * 1e3)

    thread = threading.Thread(target=pin)
    thread.start()
    beside = []
    while thread.is_alive() or not beside:
        beside.append(step_ms())
    thread.join()
    return {"step_ms_alone_median": statistics.median(alone), "step_ms_alone_max": max(alone),
            "step_ms_beside_median": statistics.median(beside),
            "step_ms_beside_max": max(beside), "steps_beside": len(beside),
            "pin_three_ms": pinned[0]}


def main() -> None:
    from raysgd.worker.host_copy import host_copies

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--way", choices=WAYS, required=True)
    parser.add_argument("--state", choices=("resnet50", "mlp"), default="resnet50")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("python -m bench.gpu.pinning needs CUDA")
    state = training_state(args.state, torch.device("cuda", 0))
    tensors = _cuda_tensors(state)
    figures: Dict[str, Any] = {
        "way": args.way, "state": args.state, "state_mib": tensor_bytes(state) / 2**20,
        "tensors": len(tensors), "device": torch.cuda.get_device_name(0),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    if args.way == "background":
        figures.update(_background(tensors))
    else:
        if args.way == "prepinned":
            start = time.perf_counter()
            pin_slabs(tensors)  # freed at once, into torch's pinned cache, for the commits
            figures["prepin_ms"] = (time.perf_counter() - start) * 1e3
        copy = (lambda: host_copies(state)) if args.way == "per_tensor" else \
            (lambda: slab_copies(tensors))
        figures["round_ms"] = _rounds(copy, args.rounds)
    emit(figures)


if __name__ == "__main__":
    main()
