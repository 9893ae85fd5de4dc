"""What the variant subprocesses share: the workload as a Ray dataset, and the epoch clock."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

from bench.child import launch_time
from bench.workloads import Workload


def workload_arrays(workload: Workload) -> tuple:
    """``(x, y)``: the workload's seeded features (float32) and labels (int64) as numpy."""
    features, labels = workload.dataset().tensors
    return features.numpy(), labels.numpy()


def workload_dataset(workload: Workload, num_blocks: int):
    """The workload's samples as an in-memory ``ray.data.Dataset`` built on the driver:
    column ``x`` (float32 tensors of the input shape) and ``y`` (int64), ``num_blocks``
    Arrow blocks in the object store. Needs a running Ray."""
    import pyarrow as pa
    import ray.data
    from ray.data.extensions import ArrowTensorArray

    x, y = workload_arrays(workload)
    bounds = [len(y) * i // num_blocks for i in range(num_blocks + 1)]
    tables = [pa.table({"x": ArrowTensorArray.from_numpy(x[lo:hi]), "y": pa.array(y[lo:hi])})
              for lo, hi in zip(bounds, bounds[1:])]
    return ray.data.from_arrow(tables)


def quiet_ray_data() -> None:
    """No progress bars: they cost CPU on a 2-core machine and only fill the log."""
    from ray.data import DataContext

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


class EpochClock:
    """Launch → end of the first (warm-up) epoch, then steady samples/s over the rest."""

    def __init__(self, workload: Workload, t0: Optional[float] = None):
        self.workload = workload
        self.t0 = launch_time() if t0 is None else t0
        self.first_epoch_s: Optional[float] = None
        self._start: Optional[float] = None
        self.steady_samples_per_s: Optional[float] = None
        self.samples_per_epoch: List[Any] = []
        self.epoch_s: List[float] = []  # each epoch's seconds (the first from launch)
        self._last: Optional[float] = None

    def epoch_done(self, samples: Any = None) -> None:
        """Call when an epoch ends, with the samples it trained on (as counted or reported)."""
        self.samples_per_epoch.append(samples)
        now = time.perf_counter()
        if self.first_epoch_s is None:
            self.first_epoch_s = time.time() - self.t0
            self._start = now
            self.epoch_s.append(self.first_epoch_s)
        else:
            self.epoch_s.append(now - self._last)
        self._last = now

    def steady_end(self) -> None:
        """Call after the last epoch: steady figure over epochs 2..N."""
        steady = len(self.samples_per_epoch) - 1
        elapsed = time.perf_counter() - self._start
        self.steady_samples_per_s = steady * self.workload.num_samples / elapsed

    def as_dict(self) -> Dict[str, Any]:
        return {"first_epoch_s": self.first_epoch_s,
                "steady_samples_per_s": self.steady_samples_per_s,
                "samples_per_epoch": self.samples_per_epoch,
                "expected_samples_per_epoch": self.workload.num_samples,
                "epochs": len(self.samples_per_epoch), "epoch_s": self.epoch_s,
                "train_end_s": time.time() - self.t0}
