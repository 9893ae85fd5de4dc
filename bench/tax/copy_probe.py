"""``python -m bench.tax.copy_probe --mode M --sizes S,... [--gpu]``: one rank's training state
per size and the time of one plain copy of it.

The state is what a commit must keep: the model's parameters and Adam's state (``exp_avg``,
``exp_avg_sq``, ``step``), after one real optimizer step on one rank's batch. A copy is
``[t.clone() for t in tensors]`` on the ranks' device with one torch thread, timed three
times (each copy freed before the next); for FSDP's ranks the tensors are each rank's 1/N
(the first 1/N of every flattened tensor). Prints one ``BENCH_RESULT`` line:
``{size: {"state_bytes": whole model's, "copy_s": {N: median}, "copy_all_s": {N: [3]}}}``.
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Dict, List

import torch

from bench.child import emit, set_threads
from bench.fsdp.model import tensor_bytes
from bench.tax import SIZES, workload_name
from bench.workloads import MODES, get_workload

COPIES = 3


def state_tensors(size: str, mode: str, device: torch.device) -> List[torch.Tensor]:
    """Parameters and Adam state of the size's model after one step on one rank's batch."""
    workload = get_workload(workload_name(size), mode)
    model = workload.model().to(device)
    optimizer = workload.optimizer(model)
    features, target = workload.dataset()[: workload.batch_size // 2]
    workload.criterion()(model(features.to(device)), target.to(device)).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state = [value for per_param in optimizer.state.values() for value in per_param.values()
             if isinstance(value, torch.Tensor)]
    return [param.detach() for param in model.parameters()] + state


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_times(tensors: List[torch.Tensor], device: torch.device) -> List[float]:
    times = []
    for _ in range(COPIES):
        _sync(device)
        start = time.perf_counter()
        copies = [tensor.clone() for tensor in tensors]
        _sync(device)
        times.append(time.perf_counter() - start)
        del copies
    return times


def share(tensors: List[torch.Tensor], ranks: int) -> List[torch.Tensor]:
    """Each tensor's first 1/``ranks`` (rounded up): about what one FSDP rank holds."""
    return [t.reshape(-1)[: -(-t.numel() // ranks)] for t in tensors]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=MODES, default="full")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--ranks", default="1,2", help="the shares to time (1: a DDP rank)")
    parser.add_argument("--gpu", action="store_true")
    args = parser.parse_args()
    set_threads(1)
    device = torch.device("cuda", 0) if args.gpu else torch.device("cpu")
    out: Dict[str, dict] = {}
    for size in args.sizes.split(","):
        tensors = state_tensors(size, args.mode, device)
        times = {n: copy_times(share(tensors, int(n)), device) for n in args.ranks.split(",")}
        out[size] = {"state_bytes": tensor_bytes(tensors), "device": str(device),
                     "copy_s": {n: statistics.median(t) for n, t in times.items()},
                     "copy_all_s": times}
        del tensors
    emit(out)


if __name__ == "__main__":
    main()
