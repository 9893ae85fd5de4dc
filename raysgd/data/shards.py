"""A worker's streamed Ray Data shard, seen by the operator as a loader. No Ray import here.

Each ``iter()`` is one pass: it asks the split's coordinator for a new epoch,
which waits until every rank asks too, so all ranks start passes together.
The order rows arrive in is decided by the stream, so a pass cannot be
replayed to a batch position: ``replayable`` is False and a restore restarts
the interrupted pass (see :mod:`raysgd.worker.passes`).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterator, Optional

import torch

from raysgd.data.dataset_config import DatasetConfig
from raysgd.worker.batches import move_to_device


class ShardLoader:
    """Batches of one rank's ``DataIterator`` (from ``streaming_split``), on ``device``."""

    replayable = False

    def __init__(self, iterator: Any, fmt: DatasetConfig, batch_size: int,
                 device: torch.device):
        self.iterator = iterator
        self.fmt = fmt
        self.batch_size = batch_size
        self.device = device

    def __iter__(self) -> Iterator[Any]:
        fmt = self.fmt
        options = dict(batch_size=self.batch_size, prefetch_batches=fmt.prefetch_batches,
                       drop_last=fmt.drop_last,
                       local_shuffle_buffer_size=fmt.local_shuffle_buffer_size)
        if fmt.collate_fn is not None:
            # Ray moves tensor batches to the device in its prefetch thread; the rest here.
            for batch in self.iterator.iter_torch_batches(collate_fn=fmt.collate_fn,
                                                          device=self.device, **options):
                yield move_to_device(batch, self.device)
            return
        for batch in self.iterator.iter_torch_batches(dtypes=fmt.dtypes, device=self.device,
                                                      **options):
            yield fmt.select(batch)


def shard_loaders(shards: dict, config_share: Optional[int], device: torch.device) -> dict:
    """``{slot: ShardLoader}`` from ``{slot: (iterator, DatasetConfig)}``; ``drop_last``
    applies to training only, so validation sees every row."""
    return {slot: ShardLoader(iterator, fmt if slot == "train" else
                              dataclasses.replace(fmt, drop_last=False),
                              fmt.batch_rows(config_share), device)
            for slot, (iterator, fmt) in shards.items()}
