"""Metric bookkeeping: per-batch averaging on a worker, reduction across workers.

Within a worker every batch is weighted by the ``num_samples`` it reports.
Across workers ``num_samples`` is summed and every other number is weighted by
the worker's ``num_samples`` (legacy RaySGD took an unweighted mean, which is
wrong whenever shards are uneven). NaN propagates; non-numbers come from rank 0.
"""
from __future__ import annotations

import numbers
from typing import Any, Dict, List, Mapping, Sequence

import torch

NUM_SAMPLES = "num_samples"
BATCH_COUNT = "batch_count"


def to_number(value: Any) -> Any:
    """Turn 0-d tensors and numpy scalars into Python numbers; leave the rest."""
    if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()
    return value


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Number) and not isinstance(value, bool)


def is_scalar_tensor(value: Any) -> bool:
    """A plain 0-d real tensor (a loss), which a meter can sum where it lives (a subclass,
    such as a DTensor, is read as a number at once, as before)."""
    return (type(value) is torch.Tensor and value.ndim == 0 and value.dtype != torch.bool
            and not value.is_complex())


class AverageMeter:
    """Running sample-weighted average of one value, plus the last value seen.

    0-d tensors are summed as tensors, on their device, and read as Python numbers only
    when ``val``, ``sum`` or ``avg`` is read: reading a CUDA tensor waits for the GPU, and
    doing it every step would stop the CPU from queueing the next step's kernels.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self._val: Any = 0.0
        self._sum: Any = 0.0
        self.count = 0
        self._updated = False  # avg is 0 until the first update, as legacy's; then NaN at n=0

    def update(self, val: Any, n: int = 1) -> None:
        if is_scalar_tensor(val):
            # Its own copy (the caller's tensor may change in place later), summed in double
            # (a bf16 loss summed in bf16 would lose digits): a float is copied once, as a
            # double, which is also its last value; an integer stays an integer.
            val = val.detach().to(torch.float64, copy=True) if val.is_floating_point() \
                else val.detach().clone()
            if isinstance(self._sum, torch.Tensor) and self._sum.device == val.device:
                self._sum = torch.add(self._sum, val, alpha=n)
            else:
                self._sum = val.double() * n + self._sum
        else:
            self._sum = val * n + self._sum
        self._val = val
        self.count += n
        self._updated = True

    def __getstate__(self) -> Dict[str, Any]:
        # Copied into commits and sent to the driver, which may have no GPU: numbers only.
        state = dict(self.__dict__)
        state["_val"], state["_sum"] = self.val, self.sum
        return state

    @property
    def val(self) -> float:
        return to_number(self._val)

    @property
    def sum(self) -> float:
        return to_number(self._sum)

    @property
    def avg(self) -> float:
        if not self.count:
            return float("nan") if self._updated else 0.0
        return self.sum / self.count


class AverageMeterCollection:
    """A meter per metric key, with batch and sample counts.

    ``summary()`` returns ``{key: average, "last_" + key: last value}`` for each
    key plus ``batch_count`` and ``num_samples``.
    """

    def __init__(self):
        self._batch_count = 0
        self.n = 0
        self._meters: Dict[str, AverageMeter] = {}
        self._last_other: Dict[str, Any] = {}  # non-numeric values: the last one seen

    def update(self, metrics: Mapping[str, Any], n: int = 1) -> None:
        self._batch_count += 1
        self.n += n
        for key, value in metrics.items():
            # A 0-d tensor is kept as it is (read at the summary); the rest read now.
            if is_scalar_tensor(value) or is_number(value := to_number(value)):
                self._meters.setdefault(key, AverageMeter()).update(value, n=n)
            else:
                self._last_other[key] = value

    def summary(self) -> Dict[str, Any]:
        stats: Dict[str, Any] = {BATCH_COUNT: self._batch_count, NUM_SAMPLES: self.n,
                                 **self._last_other}
        for key, meter in self._meters.items():
            stats[str(key)] = meter.avg
            stats["last_" + str(key)] = meter.val
        return stats


def _weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    total = sum(weights)
    if total <= 0:  # every worker reported zero samples: plain mean
        return sum(values) / len(values)
    # NaN * w is NaN for every w, so a NaN on any worker reaches the result.
    return sum(value * weight for value, weight in zip(values, weights)) / total


def reduce_worker_results(results: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Combine per-worker result dicts (rank order) into one dict."""
    if not results:
        return {}
    weights = [r.get(NUM_SAMPLES, 1) if is_number(r.get(NUM_SAMPLES, 1)) else 1 for r in results]
    return _reduce(results, weights)


def _reduce(results: Sequence[Mapping[str, Any]], weights: List[float]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    keys = dict.fromkeys(key for result in results for key in result)  # rank 0's first
    for key in keys:
        present = [(r[key], w) for r, w in zip(results, weights) if key in r]
        values = [v for v, _ in present]
        first = values[0]
        if key == NUM_SAMPLES and all(is_number(v) for v in values):
            out[key] = sum(values)
        elif all(is_number(v) for v in values) and _all_equal(values):
            out[key] = first  # e.g. ``epoch``: keep the int, skip float rounding
        elif all(is_number(v) for v in values):
            out[key] = _weighted_mean(values, [w for _, w in present])
        elif all(isinstance(v, Mapping) for v in values):
            sub = [v for v, _ in present]
            out[key] = _reduce(sub, [w for _, w in present])
        else:
            out[key] = first
    return out


def _all_equal(values: Sequence[float]) -> bool:
    # NaN != NaN, so NaNs never take this shortcut and still propagate.
    return all(v == values[0] for v in values)
