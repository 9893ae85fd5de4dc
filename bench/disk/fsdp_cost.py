"""What FSDP checkpoints every 20 steps cost an epoch, to local disk or to S3.

Under FSDP the ranks write the checkpoint (each its own shards, with DCP) and the driver
gathers the files. As ``cost.py`` does for DDP, one trainer trains blocks of epochs with its
checkpoints switched on and off in turn, so both kinds run on the same worker processes,
placement and data: two identical trainers without any checkpoint (this benchmark's design
until 2026-11-27 compared two trainers) differed by 1.3 % in median epoch time (8 epochs
each), almost half the 3 % target. Switching off
takes both halves: the driver's writer (the recorder's checkpointer swapped for the
do-nothing one) and every rank's staging (``set_staging``, run in the workers). Both kinds
commit every 20 steps. Before each block the writer is flushed, so nothing spills into the
next block, and the block starts with an untimed epoch, so its first timed epoch carries
the previous call-end write as in a real run.

``async_checkpoints`` (``FSDP(async_checkpoints=...)``) overrides raysgd's choice of how the
ranks write their shards (None: in place on CPUs, in the background with ``dcp.async_save``
on GPUs), for the comparison.
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Dict, List, Optional

from raysgd import FSDP, TorchTrainer
from raysgd.driver.run_recorder import NullCheckpointer
from raysgd.utils import BATCH_SIZE

from bench.disk.cost import KINDS
from bench.fsdp.bench_operator import FSDPBenchOperator
from bench.fsdp.model import Block
from bench.procmem import cpu_seconds

EVERY = 20  # steps between checkpoints


def _trainer(mode: str, async_checkpoints: Optional[bool] = None, **kwargs) -> TorchTrainer:
    """The FSDP benchmark's model (``full``: 6 blocks of width 768, Adam); 128 steps an epoch
    (2,048 samples, 16 a step across the 2 ranks; quick: 32 steps of 512 samples): six or
    seven in-epoch checkpoints and the call-end one."""
    quick = mode == "quick"
    config = {BATCH_SIZE: 16, "mode": "quick" if quick else "full"}
    return TorchTrainer(FSDPBenchOperator, num_workers=2, use_gpu=False, config=config,
                        strategy=FSDP(units=Block, async_checkpoints=async_checkpoints),
                        checkpoint_every_n_steps=EVERY, spare_workers=0, loggers=[], **kwargs)


def set_staging(on: bool) -> None:
    """In a worker: its rank stages its shards for the disk (``on``) or stages nothing.
    The benchmark's own switch, through the runner's internals: raysgd has no public one."""
    import gc

    from raysgd.worker.runner import WorkerRunner
    from raysgd.worker.staging import NoStaging

    for runner in [obj for obj in gc.get_objects() if isinstance(obj, WorkerRunner)]:
        if not hasattr(runner, "_bench_staging"):
            runner._bench_staging = runner._staging
        runner._staging = runner._bench_staging if on else NoStaging()


def _switch(trainer: TorchTrainer, writer: Any, off: Any, was: str, kind: str) -> str:
    """Checkpoints on (``"disk"``) or off from the next call on. The switch on the ranks
    re-commits the step (``apply_all_workers`` is a state change), so it runs while the
    driver's writer is off: that commit is never written, nor counted in ``writes``."""
    if kind != was:
        trainer._recorder.checkpointer.flush(600)  # nothing of one block spills into the next
        trainer._recorder.checkpointer = off
        trainer.apply_all_workers(lambda on=kind == "disk": set_staging(on))
        trainer._recorder.checkpointer = writer if kind == "disk" else off
    return kind


def _count_due(writer: Any) -> List[int]:
    """The steps of the in-epoch checkpoints the writer was handed. Under load it writes
    fewer (a newer commit replaces a pending one), so ``writes`` depends on the machine's
    load and this does not."""
    due: List[int] = []
    moved = writer.commit_moved

    def counting(commit: Any, in_epoch: bool) -> None:
        if in_epoch and writer.schedule.due(commit.step, call_end=False):
            due.append(commit.step)
        moved(commit, in_epoch)

    writer.commit_moved = counting
    return due


def measure(mode: str, blocks: int, epochs: int, checkpoint_dir: str,
            async_checkpoints: Optional[bool] = None,
            storage_filesystem: Any = None) -> Dict[str, Any]:
    trainer = _trainer(mode, async_checkpoints, checkpoint_dir=checkpoint_dir,
                       storage_filesystem=storage_filesystem,
                       checkpoint_every_n_steps_to_disk=EVERY, keep_checkpoints=2)
    recorder = trainer._recorder
    writer, off = recorder.checkpointer, NullCheckpointer()
    due = _count_due(writer)
    times: Dict[str, list] = {"none": [], "disk": []}
    cpu: Dict[str, list] = {"none": [], "disk": []}  # seconds of CPU, every process, per epoch
    driver_cpu: Dict[str, list] = {"none": [], "disk": []}  # of those, the driver's
    pids = [os.getpid()] + trainer.apply_all_workers(os.getpid)
    try:
        trainer.train()  # warm-up
        kind = "disk"
        for block in range(2 * blocks):
            kind = _switch(trainer, writer, off, kind, KINDS[block % 4])
            trainer.train()  # untimed: the call-end write overlaps the next epoch
            for _ in range(epochs):
                start, cpu_start = time.perf_counter(), cpu_seconds(pids)
                driver_start = time.process_time()
                trainer.train()
                times[kind].append(time.perf_counter() - start)
                cpu[kind].append(cpu_seconds(pids) - cpu_start)
                driver_cpu[kind].append(time.process_time() - driver_start)
        _switch(trainer, writer, off, kind, "disk")  # so shutdown closes the real ones
        writer.flush(600)
        steps = trainer._supervisor.commit.step
        directory = recorder.directory
        latest = directory.entries()[-1]["file"]
        size = sum(len(directory.store.read(f"{latest}/{rel}"))
                   for rel in directory.store.files(latest)) / 2 ** 20
    finally:
        trainer.shutdown()
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
            "writes": len(writer.write_seconds), "in_epoch_due": len(due),
            "checkpoint_mib": size,
            "async_checkpoints": async_checkpoints,
            "every_n_steps": EVERY, "steps": steps, "epochs_timed": len(times["disk"])}
