"""Batches: checking their shape, moving them to a device, cutting them into micro-batches."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from raysgd.errors import ConfigError


def map_tensors(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn`` to every tensor inside nested dicts, lists and tuples."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((key, map_tensors(value, fn)) for key, value in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_tensors(value, fn) for value in obj)
    return obj


def move_to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: move_to_device(item, device) for key, item in batch.items()}
    return batch


def check_tuple_batch(batch: Any, hook: str) -> Any:
    """``batch``, which the default loops unpack as ``(*features, target)`` (a dict
    would unpack its keys)."""
    if isinstance(batch, dict):
        raise ConfigError(
            f"The default {hook} takes (*features, target) batches, but got a dict with keys "
            f"{list(batch)[:8]} (a Ray Data batch). Pass TorchTrainer(dataset_config="
            "raysgd.DatasetConfig(feature_columns=[...], label_column=...)), or override "
            f"{hook} to read the dict yourself.")
    return batch


def _batch_len(batch: Any) -> int:
    if isinstance(batch, torch.Tensor):
        return batch.size(0) if batch.dim() else 1
    items = list(batch.values()) if isinstance(batch, dict) else batch
    if isinstance(items, (list, tuple)) and items:
        return _batch_len(items[0])
    raise ConfigError(f"accumulate_steps > 1 splits batches of tensors (or tuples, lists and "
                      f"dicts of them); got a {type(batch).__name__}. Override train_batch to "
                      "split it yourself.")


def _split(batch: Any, bounds: list) -> list:
    """``batch`` cut along its first dimension at ``bounds``, structure kept."""
    if isinstance(batch, torch.Tensor):
        return [batch[start:stop] for start, stop in bounds]
    if isinstance(batch, dict):
        parts = {key: _split(value, bounds) for key, value in batch.items()}
        return [{key: parts[key][i] for key in batch} for i in range(len(bounds))]
    if isinstance(batch, (list, tuple)):
        parts = [_split(item, bounds) for item in batch]
        return [type(batch)(part[i] for part in parts) for i in range(len(bounds))]
    raise ConfigError(f"Cannot split a {type(batch).__name__} into micro-batches; override "
                      "train_batch to split it yourself.")


def split_batch(batch: Any, num: int) -> list:
    """``[(micro_batch, weight), ...]``: at most ``num`` near-equal, non-empty pieces."""
    if num <= 1:
        return [(batch, 1)]
    total = _batch_len(batch)
    num = max(1, min(num, total))
    edges = [round(i * total / num) for i in range(num + 1)]
    bounds = list(zip(edges[:-1], edges[1:]))
    return [(piece, (stop - start) / total)
            for piece, (start, stop) in zip(_split(batch, bounds), bounds)]


def batch_count(iterable: Any, before: int = 0) -> Optional[int]:
    """Batches in a call (``before`` of them done earlier), or None when unknown."""
    try:
        return before + len(iterable)
    except TypeError:
        return None
