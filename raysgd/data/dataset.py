"""Legacy ``ray.util.sgd.data.dataset.Dataset``, now a face over Ray Data (see :mod:`raysgd.data`)."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from raysgd.data.dataset_config import DatasetConfig
from raysgd.errors import ConfigError


class LegacyBatch:
    """Ray 1.12's batch format: ``download_func`` per item, then features and targets each
    concatenated along dimension 0. Runs in Ray Data's prefetch thread on the worker."""

    def __init__(self, download_func: Optional[Callable], transform: Optional[Callable]):
        self.download_func = download_func
        self.transform = transform

    def __call__(self, batch: dict) -> tuple:
        items = batch["item"]
        pairs = [self.download_func(item) if self.download_func else item for item in items]
        features, targets = zip(*pairs)
        if self.transform is not None:
            features = [self.transform(feature) for feature in features]
        return torch.cat(list(features)), torch.cat(list(targets))


class Dataset:
    """Items streamed to the workers in batches of ``batch_size`` per worker.

    ``data``: a list (or any finite iterable) of items; ``download_func(item)``
    returns ``(features, target)`` tensors (without it each item is such a pair);
    ``transform`` applies to each item's features. Pass it to
    ``trainer.train(dataset=...)``: the driver streams the items as a ``ray.data``
    dataset split across the workers, like ``TorchTrainer(datasets=...)``. ``max_concurrency`` is accepted
    and ignored (Ray Data sizes its own concurrency).
    """

    def __init__(self, data: Any, batch_size: int = 32, download_func: Optional[Callable] = None,
                 max_concurrency: int = 0, transform: Optional[Callable] = None):
        if isinstance(data, (str, bytes)) or not hasattr(data, "__iter__"):
            raise ConfigError(f"Dataset(data=...) takes a list of items, got {type(data).__name__}. "
                              "(ray.util.iter's ParallelIterator is gone with Ray 2.)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"Dataset(batch_size=...) must be an int >= 1, got {batch_size!r}.")
        for name, fn in (("download_func", download_func), ("transform", transform)):
            if fn is not None and not callable(fn):
                raise ConfigError(f"Dataset({name}=...) must be callable, got {fn!r}.")
        self.items = list(data)
        self.batch_size = batch_size
        self.download_func = download_func
        self.transform = transform

    def batch_config(self) -> DatasetConfig:
        """How the workers build batches of these items (the driver streams the items)."""
        return DatasetConfig(batch_size=self.batch_size,
                             collate_fn=LegacyBatch(self.download_func, self.transform))
