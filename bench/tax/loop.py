"""Variant: the hand-written loop under ``torchrun``: DDP (``--strategy ddp``) or FSDP2
(``--strategy fsdp``: ``fully_shard`` on every ``nn.Linear``, then the model, as raysgd's
``FSDP(units=nn.Linear)``), a ``DistributedSampler``, Adam; rank 0 prints steady samples/s
and every epoch's seconds (the first included).

``--gpu``: every rank on the machine's first GPU, as raysgd's ranks share it
(``bench.recovery.raysgd_kill.gpu_settings``): NCCL for one rank, gloo for more.
"""
from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from bench.child import Figures, emit, leave_process_group, parse_args, set_threads
from bench.fsdp.torchrun_fsdp import shard_units
from bench.loop import run_epochs
from bench.tax import cell_args
from bench.workloads import get_workload


def main() -> None:
    args = parse_args(__doc__, cell_args)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    figures = Figures(workload)
    device = torch.device("cuda", 0) if args.gpu else torch.device("cpu")
    if args.gpu:
        torch.cuda.set_device(device)
    world = int(os.environ["WORLD_SIZE"])  # torchrun's
    dist.init_process_group("nccl" if args.gpu and world == 1 else "gloo")
    model = workload.model().to(device)
    if args.strategy == "fsdp":
        model = shard_units(model, nn.Linear, mesh=init_device_mesh(device.type, (world,)))
    else:
        model = DistributedDataParallel(model, device_ids=[device] if args.gpu else None)
    dataset = workload.dataset()
    loader = DataLoader(dataset, batch_size=workload.batch_size // world,
                        sampler=DistributedSampler(dataset, shuffle=True))
    epoch_s, last = [], [time.perf_counter()]

    def epoch_end(_epoch: int) -> None:
        if args.gpu:
            torch.cuda.synchronize(device)
        now = time.perf_counter()
        epoch_s.append(now - last[0])
        last[0] = now

    run_epochs(model, workload.optimizer(model), workload.criterion(), loader, figures,
               device=device if args.gpu else None, on_epoch_end=epoch_end)
    if dist.get_rank() == 0:
        emit({**figures.as_dict(), "epoch_s": epoch_s, "strategy": args.strategy,
              "world": world})
    leave_process_group()


if __name__ == "__main__":
    main()
