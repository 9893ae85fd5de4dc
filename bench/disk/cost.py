"""What a disk checkpoint at the end of every epoch costs the epoch, measured in one process.

Per round, one trainer without ``checkpoint_dir`` and one with it train a
warm-up epoch and then ``epochs`` timed epochs each (order alternating between
rounds). The write itself runs on a driver thread while the next epoch trains,
so its cost is whatever it takes from that epoch (CPU, memory bandwidth).
"""
from __future__ import annotations

import os
import statistics
import time
from typing import Any, Dict

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.disk.operators import DigitsBenchOperator
from bench.raysgd_operator import BenchOperator
from bench.workloads import get_workload


def _trainer(case: str, mode: str, checkpoint_dir) -> TorchTrainer:
    if case == "mlp":
        workload = get_workload("mlp", mode)
        operator, config = BenchOperator, {BATCH_SIZE: workload.batch_size, "workload": "mlp",
                                           "mode": mode}
    else:
        operator, config = DigitsBenchOperator, {BATCH_SIZE: 64}
    return TorchTrainer(operator, num_workers=2, use_gpu=False, config=config,
                        checkpoint_dir=checkpoint_dir, loggers=[])


def measure(case: str, mode: str, rounds: int, epochs: int, tmp: str) -> Dict[str, Any]:
    times: Dict[str, list] = {"none": [], "disk": []}
    writes, size = [], None
    for index in range(rounds):
        for kind in (("none", "disk") if index % 2 == 0 else ("disk", "none")):
            directory = os.path.join(tmp, f"{case}-{index}") if kind == "disk" else None
            trainer = _trainer(case, mode, directory)
            trainer.train()  # warm-up (and, with a directory, the first write)
            for _ in range(epochs):
                start = time.perf_counter()
                trainer.train()
                times[kind].append(time.perf_counter() - start)
            if directory:
                checkpointer = trainer._recorder.checkpointer
                checkpointer.flush()
                writes += checkpointer.write_seconds
                size = os.path.getsize(checkpointer.last_path) / 2 ** 20
            trainer.shutdown()
    none, disk = statistics.median(times["none"]), statistics.median(times["disk"])
    return {"epoch_s_none": none, "epoch_s_disk": disk, "cost": disk / none - 1,
            "epoch_s_none_all": times["none"], "epoch_s_disk_all": times["disk"],
            "write_s": statistics.median(writes), "checkpoint_mib": size,
            "epochs_timed": len(times["disk"])}
