"""The Ray Data side of a feed: a plain collate function as Ray Data's collate class, and a
legacy ``raysgd.data.Dataset`` as a Ray dataset.

Kept apart from :mod:`raysgd.data.feed` because importing Ray Data (pandas, pyarrow and
about 500 modules) costs about a CPU-second: ``raysgd.trainer`` and the legacy
``raysgd.torch`` face, which every operator module imports on every worker, must not
pay it when no dataset is given. The feed imports this module only for a dataset or a
``collate_fn``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import ray.data
from ray.data.collate_fn import CollateFn, NumpyBatchCollateFn

from raysgd.data.dataset_config import DatasetConfig


class NumpyCollate(NumpyBatchCollateFn):
    """A plain function as Ray Data's collate class (a bare function is deprecated there)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def __call__(self, batch):
        return self.fn(batch)


def ray_collate(fmt: DatasetConfig) -> DatasetConfig:
    """``fmt`` with its ``collate_fn`` as a Ray Data collate class."""
    if fmt.collate_fn is None or isinstance(fmt.collate_fn, CollateFn):
        return fmt
    return dataclasses.replace(fmt, collate_fn=NumpyCollate(fmt.collate_fn))


def from_items(items: Any) -> Any:
    """A legacy dataset's items as a ``ray.data.Dataset``."""
    return ray.data.from_items(items)
