"""How Ray Data batches become the operator's batches, and checks of dataset inputs. No Ray here.

``DatasetConfig`` is frozen and checked on the driver. A worker applies it to
each dict batch that ``iter_torch_batches`` yields (see :mod:`raysgd.data.shards`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from raysgd.errors import ConfigError

SLOTS = ("train", "validation")  # the keys of TorchTrainer(datasets=...)
DEFAULT_BATCH_SIZE = 256  # per worker, as Ray Data's iter_torch_batches


def is_ray_dataset(obj: Any) -> bool:
    """True for a ``ray.data.Dataset``; never imports Ray Data (no import, no instance)."""
    data = sys.modules.get("ray.data")
    return data is not None and isinstance(obj, data.Dataset)


def _positive_int(name: str, value: Any, allow_none: bool = True, minimum: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"DatasetConfig({name}=...) must be an int >= {minimum}, got {value!r}.")


@dataclass(frozen=True)
class DatasetConfig:
    """How each worker turns its streamed Ray Data batches into batches for the operator.

    - ``feature_columns`` / ``label_column``: batches become ``(*features, label)``
      tensors, which the default ``train_batch`` / ``validate_batch`` expect.
      With only ``label_column``, every other column is a feature, in schema order.
    - ``collate_fn``: Ray Data's ``iter_torch_batches(collate_fn=...)``: a function of
      the numpy dict batch returning any batch; it runs in Ray Data's prefetch
      thread, and tensors in its result are moved to the worker's device.
    - Neither: the operator receives ``{column: tensor}`` dicts (override ``train_batch``).
    - ``batch_size``: rows per batch on each worker. Without it the worker's share of
      ``config[BATCH_SIZE]`` is used, as for loaders; without both, 256.
    - ``prefetch_batches``, ``dtypes``, ``drop_last``, ``local_shuffle_buffer_size``:
      passed to ``iter_torch_batches`` (``dtypes`` only without ``collate_fn``).
    """

    feature_columns: Optional[Tuple[str, ...]] = None
    label_column: Optional[str] = None
    collate_fn: Optional[Callable[[Dict[str, Any]], Any]] = None
    batch_size: Optional[int] = None
    prefetch_batches: int = 1
    dtypes: Any = None
    drop_last: bool = False
    local_shuffle_buffer_size: Optional[int] = None

    def __post_init__(self):
        columns = self.feature_columns
        if isinstance(columns, str):
            object.__setattr__(self, "feature_columns", (columns,))
        elif columns is not None:
            if not columns or not all(isinstance(c, str) for c in columns):
                raise ConfigError("DatasetConfig(feature_columns=...) takes a non-empty list of "
                                  f"column names, got {columns!r}.")
            object.__setattr__(self, "feature_columns", tuple(columns))
        if self.label_column is not None and not isinstance(self.label_column, str):
            raise ConfigError("DatasetConfig(label_column=...) takes a column name, got "
                              f"{self.label_column!r}.")
        if self.collate_fn is not None:
            if not callable(self.collate_fn):
                raise ConfigError(f"DatasetConfig(collate_fn=...) must be callable, got "
                                  f"{self.collate_fn!r}.")
            if self.feature_columns or self.label_column or self.dtypes is not None:
                raise ConfigError("DatasetConfig takes either collate_fn or feature_columns/"
                                  "label_column/dtypes: collate_fn builds the whole batch itself.")
        _positive_int("batch_size", self.batch_size)
        _positive_int("prefetch_batches", self.prefetch_batches, allow_none=False, minimum=0)
        _positive_int("local_shuffle_buffer_size", self.local_shuffle_buffer_size)

    @property
    def selects_columns(self) -> bool:
        return bool(self.feature_columns) or self.label_column is not None

    def batch_rows(self, config_share: Optional[int]) -> int:
        """Rows per batch on one worker: our own, else the worker's share of BATCH_SIZE."""
        return self.batch_size or config_share or DEFAULT_BATCH_SIZE

    def select(self, batch: Mapping[str, Any]) -> Any:
        """``(*features, label)`` from a dict batch, or the dict itself without columns."""
        if not self.selects_columns:
            return batch
        features = self.feature_columns or tuple(c for c in batch if c != self.label_column)
        wanted = features + ((self.label_column,) if self.label_column is not None else ())
        missing = [c for c in wanted if c not in batch]
        if missing:
            raise ConfigError(f"DatasetConfig names column(s) {missing} that the dataset does not "
                              f"have; its batches have {list(batch)}.")
        return tuple(batch[c] for c in wanted)


def describe(obj: Any) -> str:
    return f"a {type(obj).__module__}.{type(obj).__qualname__}"


def check_dataset(where: str, dataset: Any) -> None:
    """``dataset`` must be a ``ray.data.Dataset`` or a legacy ``raysgd.data.Dataset``."""
    if is_ray_dataset(dataset) or hasattr(dataset, "batch_config"):  # or a legacy Dataset
        return
    raise ConfigError(
        f"{where} takes a ray.data.Dataset; got {describe(dataset)}. Build one on the driver "
        "(ray.data.from_numpy, from_items, read_parquet, ...), or wrap in-memory data in a "
        "torch DataLoader and register it in setup() with self.register_data(train_loader=...).")


def check_datasets(datasets: Any) -> Dict[str, Any]:
    """``TorchTrainer(datasets=...)``: a dict of ``"train"`` / ``"validation"`` datasets."""
    if datasets is None:
        return {}
    if not isinstance(datasets, Mapping):
        raise ConfigError(f"datasets must be a dict like {{'train': ds, 'validation': val_ds}}, "
                          f"got {describe(datasets)}.")
    unknown = [key for key in datasets if key not in SLOTS]
    if unknown:
        raise ConfigError(f"datasets has key(s) {unknown}; the keys are 'train' and "
                          "'validation'.")
    for key, dataset in datasets.items():
        check_dataset(f"datasets[{key!r}]", dataset)
    return dict(datasets)


def check_dataset_config(config: Any) -> DatasetConfig:
    if config is None:
        return DatasetConfig()
    if not isinstance(config, DatasetConfig):
        raise ConfigError("dataset_config must be a raysgd.DatasetConfig(feature_columns=..., "
                          f"label_column=...), got {describe(config)}.")
    return config
