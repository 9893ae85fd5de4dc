"""``python -m bench.gpu.commit_copy [--state resnet50|mlp] [--rounds N]``: what a commit's copy
of a rank's state to host memory costs on a GPU, two ways, alternating in one process:

* ``pageable``: each tensor ``.to("cpu", copy=True)`` (raysgd before; the CPU waits per tensor);
* ``pinned``: :func:`raysgd.worker.host_copy.host_copies` (non-blocking copies into pinned
  memory, one wait).

The state is a model's parameters, buffers and optimizer state after one step (ResNet-50
with SGD momentum, 205 MB; or the FSDP benchmark's GPU MLP with Adam, 1.6 GB). The last two
copies of each way stay alive, as a trainer holds its last commits, so the pinned cache
cannot simply hand the same blocks back. Prints one JSON line (``BENCH_RESULT``).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

from bench.child import emit
from bench.fsdp.model import tensor_bytes


def training_state(kind: str, device: torch.device):
    """A rank's state after one optimizer step on ``device``: ResNet-50 with SGD momentum, or
    the FSDP benchmark's GPU MLP with Adam (``models`` and ``optimizers``, as commits hold)."""
    if kind == "resnet50":
        from bench.gpu.models import resnet50
        model = resnet50(1000).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(8, 3, 224, 224, device=device)
    else:
        from bench.fsdp.model import SIZES
        model = SIZES["gpu"].model().to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        x = torch.randn(8, SIZES["gpu"].width, device=device)
    model(x).float().sum().backward()
    optimizer.step()  # the optimizer state exists after a step
    return {"models": [model.state_dict()], "optimizers": [optimizer.state_dict()]}


def _pageable(state):
    from raysgd.worker.batches import map_tensors
    return map_tensors(state, lambda t: t.detach().to("cpu", copy=True))


def main() -> None:
    from raysgd.worker.host_copy import host_copies

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state", choices=("resnet50", "mlp"), default="resnet50")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("python -m bench.gpu.commit_copy needs CUDA")
    device = torch.device("cuda", 0)
    state = training_state(args.state, device)
    ways = {"pageable": _pageable, "pinned": host_copies}
    held = {name: collections.deque(maxlen=2) for name in ways}
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, copy in ways.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            held[name].append(copy(state))
            times[name].append(time.perf_counter() - start)
    size = tensor_bytes(state)
    figures = {"state": args.state, "state_mib": size / 2**20, "rounds": args.rounds,
               "device": torch.cuda.get_device_name(device)}
    for name, seconds in times.items():
        steady = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
        figures[f"{name}_first_ms"] = seconds[0] * 1e3
        figures[f"{name}_median_ms"] = steady * 1e3
        figures[f"{name}_gb_per_s"] = size / steady / 1e9
    figures["pinned/pageable time"] = figures["pinned_median_ms"] / figures["pageable_median_ms"]
    emit(figures)


if __name__ == "__main__":
    main()
