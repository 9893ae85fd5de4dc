"""``python -m bench.disk.dcp_write``: what an in-place FSDP checkpoint costs the training
thread, torch's defaults against raysgd's write, in one pair of processes.

``make bench-disk``'s FSDP rows compare two trainers' epochs, and on this VM runs of the
same code read anywhere from 0 to +11 %: too noisy to see a change of a few tens of ms per
checkpoint. Here two gloo ranks train the FSDP benchmark's model (``bench/fsdp/model``,
fully sharded, Adam) in blocks of 60 steps with a checkpoint every 20, the blocks rotating
between no checkpoint, ``dcp.save`` with torch's defaults (CRC32 on every record, every
file synced) and ``raysgd.worker.dcp_io.save`` in place (no CRC32, unsynced: the driver
syncs the files where it places them), so all three share the processes, the data and the
moment. Prints the median block time of each, the cost per checkpoint from the block
difference (noisy: a block's time varies by about 0.1 s) and the median time the training
thread spent inside each write (the steadier figure). No Ray.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import warnings

STEPS, EVERY = 60, 20
KINDS = ("none", "torch defaults", "raysgd in place")


def _rank(rank: int, blocks: int, port: int, root: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.fsdp import fully_shard

    from bench.fsdp.model import SIZES, Block
    from raysgd.worker import dcp_io

    warnings.filterwarnings("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = SIZES["full"].model()
    for block in model:
        if isinstance(block, Block):
            fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters())
    x, y = torch.randn(8, 768), torch.randn(8, 1)

    def save(kind: str, path: str) -> None:
        if kind == "torch defaults":
            models, optimizers = get_state_dict(model, [optimizer])
            dcp.save({"models": models, "optimizers": optimizers}, checkpoint_id=path)
        elif kind == "raysgd in place":
            dcp_io.save([model], [optimizer], path)

    times = {kind: [] for kind in KINDS}
    in_save = {kind: [] for kind in KINDS}  # the training thread's time inside each write
    for number in range(3 * blocks):
        kind = KINDS[(number + number // 3) % 3]  # each kind in every position in turn
        dist.barrier()
        start = time.perf_counter()
        for step in range(STEPS):
            ((model(x) - y) ** 2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if (step + 1) % EVERY == 0:
                begin = time.perf_counter()
                save(kind, os.path.join(root, f"{number}-{step}"))
                in_save[kind].append(time.perf_counter() - begin)
        dist.barrier()
        times[kind].append(time.perf_counter() - start)
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
    if rank == 0:
        none = statistics.median(times["none"])
        for kind in KINDS:
            block = statistics.median(times[kind])
            per = (block - none) / (STEPS // EVERY) * 1000
            inside = statistics.median(in_save[kind]) * 1000 if in_save[kind] else 0.0
            print(f"{kind:16s} block {block:.3f} s   per checkpoint {per:+.0f} ms "
                  f"(block difference)   inside the write {inside:.0f} ms (median)")
    dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.disk.dcp_write",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=6, help="blocks of each kind")
    args = parser.parse_args(argv)
    import torch.multiprocessing as mp

    from bench.disk.s3 import free_port

    root = tempfile.mkdtemp(prefix="raysgd-bench-dcp-")
    try:
        mp.spawn(_rank, args=(args.blocks, free_port(), root), nprocs=2)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
