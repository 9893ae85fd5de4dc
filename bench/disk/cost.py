"""What a disk checkpoint at the end of every epoch costs the epoch, measured in one process.

One trainer with ``checkpoint_dir`` trains blocks of epochs with its disk
writer switched on and off in turn (the recorder's checkpointer swapped for
the do-nothing one), so both kinds run on the same workers, placement and
data: between separate trainers the epoch time varies by more than the
effect. The write runs on a driver thread while the next epoch trains, so
its cost is whatever it takes from that epoch (CPU, memory bandwidth, GIL).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Dict, Optional

from raysgd import TorchTrainer
from raysgd.driver.run_recorder import NullCheckpointer
from raysgd.utils import BATCH_SIZE

from bench.disk.operators import DigitsBenchOperator
from bench.raysgd_operator import BenchOperator
from bench.workloads import get_workload


# Blocks in the order disk, none, none, disk, ...: the machine's speed drifts over minutes
# (seen: 8 % within one 5-minute run), and a fixed disk-first order credited it to one kind.
KINDS = ("disk", "none", "none", "disk")


def _trainer(case: str, mode: str, checkpoint_dir) -> TorchTrainer:
    if case == "mlp":
        workload = get_workload("mlp", mode)
        operator, config = BenchOperator, {BATCH_SIZE: workload.batch_size, "workload": "mlp",
                                           "mode": mode}
    else:
        operator, config = DigitsBenchOperator, {BATCH_SIZE: 64}
    return TorchTrainer(operator, num_workers=2, use_gpu=False, config=config,
                        checkpoint_dir=checkpoint_dir, loggers=[])


def measure(case: str, mode: str, blocks: int, epochs: int, tmp: str,
            checkpoint_dir: Optional[str] = None) -> Dict[str, Any]:
    """``blocks`` blocks of each kind, alternating, ``epochs`` timed epochs per block;
    checkpoints go to ``checkpoint_dir`` (a URI) or a directory under ``tmp``."""
    trainer = _trainer(case, mode, checkpoint_dir or os.path.join(tmp, case))
    recorder = trainer._recorder
    writer, off = recorder.checkpointer, NullCheckpointer()
    times: Dict[str, list] = {"none": [], "disk": []}
    driver_cpu: Dict[str, list] = {"none": [], "disk": []}  # every thread of this process
    trainer.train()  # warm-up
    for block in range(2 * blocks):
        kind = KINDS[block % 4]
        writer.flush()  # nothing of the previous block spills into this one
        recorder.checkpointer = writer if kind == "disk" else off
        trainer.train()  # untimed: with a directory, its write overlaps the next epoch
        for _ in range(epochs):
            start, cpu_start = time.perf_counter(), time.process_time()
            trainer.train()
            times[kind].append(time.perf_counter() - start)
            driver_cpu[kind].append(time.process_time() - cpu_start)
    recorder.checkpointer = writer  # so shutdown closes the real one
    writer.flush()
    directory = recorder.directory
    size = len(directory.store.read(directory.entries()[-1]["file"])) / 2 ** 20
    trainer.shutdown()
    none, disk = statistics.median(times["none"]), statistics.median(times["disk"])
    return {"epoch_s_none": none, "epoch_s_disk": disk, "cost": disk / none - 1,
            "epoch_s_none_all": times["none"], "epoch_s_disk_all": times["disk"],
            "write_s": statistics.median(writer.write_seconds),
            "write_cpu_s": statistics.median(writer.write_cpu_seconds),
            # The floor of the cost on a machine whose cores the 2 workers fill: the
            # writer's CPU delays one rank, and DDP makes the other wait for it. Counted
            # over the driver's every thread (pyarrow uploads on threads of its own).
            "cpu_share": (statistics.mean(driver_cpu["disk"]) -
                          statistics.mean(driver_cpu["none"])) / none,
            "driver_cpu_s_none": statistics.mean(driver_cpu["none"]),
            "driver_cpu_s_disk": statistics.mean(driver_cpu["disk"]),
            "checkpoint_mib": size,
            "epochs_timed": len(times["disk"])}
