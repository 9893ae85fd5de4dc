"""What FSDP checkpoints every 20 steps cost an epoch, to local disk or to S3.

Under FSDP the ranks write the checkpoint (each its own shards, with DCP), so the writer
cannot be switched off inside one trainer as ``cost.py`` does for DDP. Two trainers live
side by side instead, on the same Ray, the same model and data, both committing every 20
steps: one without ``checkpoint_dir``, one writing every 20 steps. Blocks of epochs
alternate between them; before each block the writing trainer's checkpoints are flushed,
so nothing spills into the other's block, and the block starts with an untimed epoch, so
its first timed epoch carries the previous call-end write as in a real run.

``async_checkpoints`` (``FSDP(async_checkpoints=...)``) overrides raysgd's choice of how the
ranks write their shards (None: in place on CPUs, in the background with ``dcp.async_save``
on GPUs), for the comparison.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Dict, Optional

from raysgd import FSDP, TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.fsdp.bench_operator import FSDPBenchOperator
from bench.fsdp.model import Block

EVERY = 20  # steps between checkpoints


def _trainer(mode: str, async_checkpoints: Optional[bool] = None, **kwargs) -> TorchTrainer:
    """The FSDP benchmark's model (``full``: 6 blocks of width 768, Adam); 64 steps an epoch
    per rank (2,048 samples, 16 per rank and step; quick: 16 steps, 512 samples, 16)."""
    quick = mode == "quick"
    config = {BATCH_SIZE: 16, "mode": "quick" if quick else "full"}
    return TorchTrainer(FSDPBenchOperator, num_workers=2, use_gpu=False, config=config,
                        strategy=FSDP(units=Block, async_checkpoints=async_checkpoints),
                        checkpoint_every_n_steps=EVERY, spare_workers=0, loggers=[], **kwargs)


def cpu_seconds(pids) -> float:
    """User + system CPU time of these processes (all their threads) so far."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def measure(mode: str, blocks: int, epochs: int, checkpoint_dir: str,
            async_checkpoints: Optional[bool] = None,
            storage_filesystem: Any = None) -> Dict[str, Any]:
    plain = _trainer(mode)
    disk = _trainer(mode, async_checkpoints, checkpoint_dir=checkpoint_dir,
                    storage_filesystem=storage_filesystem,
                    checkpoint_every_n_steps_to_disk=EVERY, keep_checkpoints=2)
    writer = disk._recorder.checkpointer
    times: Dict[str, list] = {"none": [], "disk": []}
    cpu: Dict[str, list] = {"none": [], "disk": []}  # seconds of CPU, every process, per epoch
    driver_cpu: Dict[str, list] = {"none": [], "disk": []}  # of those, the driver's
    pids = [os.getpid()] + plain.apply_all_workers(os.getpid) + disk.apply_all_workers(os.getpid)
    try:
        plain.train()  # warm-up of both
        disk.train()
        for block in range(2 * blocks):
            kind = "disk" if block % 2 == 0 else "none"
            trainer = disk if kind == "disk" else plain
            writer.flush(600)
            trainer.train()  # untimed: the call-end write overlaps the next epoch
            for _ in range(epochs):
                start, cpu_start = time.perf_counter(), cpu_seconds(pids)
                driver_start = time.process_time()
                trainer.train()
                times[kind].append(time.perf_counter() - start)
                cpu[kind].append(cpu_seconds(pids) - cpu_start)
                driver_cpu[kind].append(time.process_time() - driver_start)
        writer.flush(600)
        steps = disk._supervisor.commit.step
        directory = disk._recorder.directory
        latest = directory.entries()[-1]["file"]
        size = sum(len(directory.store.read(f"{latest}/{rel}"))
                   for rel in directory.store.files(latest)) / 2 ** 20
    finally:
        disk.shutdown()
        plain.shutdown()
    none, with_disk = statistics.median(times["none"]), statistics.median(times["disk"])
    cpu_none, cpu_disk = statistics.median(cpu["none"]), statistics.median(cpu["disk"])
    return {"epoch_s_none": none, "epoch_s_disk": with_disk, "cost": with_disk / none - 1,
            "cpu_s_none": cpu_none, "cpu_s_disk": cpu_disk,
            # The steadier figure on a machine whose cores the workers fill: the CPU the
            # checkpoints added (every process: ranks, their write threads, the driver), as
            # a share of the CPU an epoch takes without them.
            "cpu_cost": cpu_disk / cpu_none - 1,
            # The driver's part of it (pyarrow's uploads to an object store run there).
            "driver_cpu_cost": (statistics.median(driver_cpu["disk"]) -
                                statistics.median(driver_cpu["none"])) / cpu_none,
            "epoch_s_none_all": times["none"], "epoch_s_disk_all": times["disk"],
            "write_s": statistics.median(writer.write_seconds),
            "writes": len(writer.write_seconds), "checkpoint_mib": size,
            "async_checkpoints": async_checkpoints,
            "every_n_steps": EVERY, "steps": steps, "epochs_timed": len(times["disk"])}
