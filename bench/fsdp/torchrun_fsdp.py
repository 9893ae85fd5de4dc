"""Variant: a hand-written FSDP2 loop under ``torchrun --nproc_per_node=N`` (gloo, CPU).

The same model, data split (``DistributedSampler``), units (every ``Block``) and Adam as
raysgd's FSDP variant; rank 0 prints steady samples/s and every rank its peak memory.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

from bench.child import emit
from bench.fsdp.model import SIZES, Block, reset_peak, status_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=tuple(SIZES), default="full")
    args = parser.parse_args()
    torch.set_num_threads(1)
    size = SIZES[args.mode]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    baseline = reset_peak()
    model = size.model()
    mesh = init_device_mesh("cpu", (world,))
    for block in model:
        if isinstance(block, Block):
            fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
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
            optimizer.zero_grad(set_to_none=True)
            criterion(model(x), y).backward()
            optimizer.step()
    dist.barrier()
    steady = (size.epochs - 1) * size.samples / (time.perf_counter() - start)
    peaks = [None] * world
    dist.all_gather_object(peaks, (status_bytes("VmHWM") - baseline) / 2**20)
    if rank == 0:
        emit({"strategy": "torchrun-fsdp2", "workers": world, "steady_samples_per_s": steady,
              "peak_growth_mib": peaks})
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
