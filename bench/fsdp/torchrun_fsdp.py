"""Variant: a hand-written FSDP2 loop under ``torchrun --nproc_per_node=N`` (gloo, CPU; with
``--gpu``, NCCL and bf16: ``MixedPrecisionPolicy`` plus autocast, as raysgd's ``use_fp16="bf16"``).

The same model, data split (``DistributedSampler``), units (every ``Block``) and Adam as
raysgd's FSDP variant; rank 0 prints steady samples/s and every rank its peak memory.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from bench.child import emit, leave_process_group
from bench.fsdp.model import SIZES, Block, reset_peak, status_bytes


def shard_units(model: nn.Module, unit: type, **options) -> nn.Module:
    """``fully_shard`` every ``unit`` submodule (children before parents, siblings in order),
    then the model as the root unit, as ``raysgd.FSDP(units=unit)`` shards."""
    def below(module: nn.Module) -> None:
        for child in module.children():
            below(child)
            if isinstance(child, unit):
                fully_shard(child, **options)

    below(model)
    return fully_shard(model, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=tuple(SIZES), default="full")
    parser.add_argument("--gpu", action="store_true", help="NCCL and bf16 on this rank's GPU")
    args = parser.parse_args()
    torch.set_num_threads(1)
    size = SIZES[args.mode]
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.gpu \
        else torch.device("cpu")
    if args.gpu:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if args.gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    baseline = reset_peak()
    model = size.model().to(device)
    mesh = init_device_mesh(device.type, (world,))
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    options = {"mesh": mesh, **({"mp_policy": bf16} if args.gpu else {})}
    shard_units(model, Block, **options)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if args.gpu \
        else contextlib.nullcontext
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = size.data()
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False)
    loader = DataLoader(data, batch_size=size.batch // world, sampler=sampler)
    criterion = nn.MSELoss()
    start = None
    for epoch in range(size.epochs):
        if epoch == 1:
            dist.barrier()
            start = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    if args.gpu:
        torch.cuda.synchronize()  # the GPU's queue, not just the host's loop
    dist.barrier()
    steady = (size.epochs - 1) * size.samples / (time.perf_counter() - start)
    peaks = [None] * world
    dist.all_gather_object(peaks, (status_bytes("VmHWM") - baseline) / 2**20)
    if rank == 0:
        emit({"strategy": "torchrun-fsdp2", "workers": world, "steady_samples_per_s": steady,
              "peak_growth_mib": peaks,
              "gpu_peak_mib": [torch.cuda.max_memory_allocated() / 2**20] if args.gpu else None})
    leave_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
