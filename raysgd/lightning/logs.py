"""``self.log`` / ``self.log_dict`` values → raysgd metrics.

A value logged inside ``training_step`` / ``validation_step`` (or a batch hook)
becomes that batch's metric: raysgd averages it over the call's batches,
weighted by the batch size, then over the workers, weighted by their samples,
and reports the average under the logged name plus ``last_<name>``. A value
logged in an epoch hook (``on_train_epoch_end``, ...) goes into the call's
result as is (then averaged over the workers). A torchmetrics ``Metric``
is computed and reset at the end of the call. ``rank_zero_only=True`` values
come from rank 0 alone. Lightning's ``sync_dist`` is not needed: every metric
is reduced across workers on the driver.
"""
from __future__ import annotations

import numbers
import warnings
from typing import Any, Callable, Dict, Mapping, Optional

import torch


def is_metric_object(value: Any) -> bool:
    """A torchmetrics ``Metric`` (duck-typed: raysgd does not import torchmetrics)."""
    return isinstance(value, torch.nn.Module) and all(
        callable(getattr(value, name, None)) for name in ("update", "compute", "reset"))


def to_float(name: str, value: Any) -> float:
    """One logged value as a float; Lightning's rules for what may be logged."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}, ...) got a tensor of shape "
                             f"{tuple(value.shape)}; log one number, e.g. value.mean().")
        return float(value.detach().float().item())
    if isinstance(value, numbers.Number):
        return float(value)
    if isinstance(value, Mapping):
        raise ValueError(f"self.log({name!r}, ...) got a dict; use self.log_dict(...) for "
                         "several values (nested dicts cannot be logged).")
    raise ValueError(f"self.log({name!r}, ...) takes a number, a one-element tensor or a "
                     f"torchmetrics Metric, got {type(value).__name__}.")


class _Scope:
    """The values logged in one batch, or in one call's epoch hooks."""

    def __init__(self):
        self.sums: Dict[str, float] = {}
        self.counts: Dict[str, int] = {}
        self.batch_size: Optional[int] = None

    def add(self, name: str, value: float) -> None:
        # Logged twice in one batch (e.g. once per micro-batch): the mean of both.
        self.sums[name] = self.sums.get(name, 0.0) + value
        self.counts[name] = self.counts.get(name, 0) + 1

    def means(self) -> Dict[str, float]:
        return {name: total / self.counts[name] for name, total in self.sums.items()}


class LogCollector:
    """Receives a module's ``self.log`` calls while raysgd runs its hooks."""

    def __init__(self, is_global_zero: Callable[[], bool]):
        self._is_global_zero = is_global_zero
        self._batch: Optional[_Scope] = None
        self._epoch: Optional[_Scope] = None
        self._metric_objects: Dict[str, Any] = {}
        self._warned: set = set()

    # ------------------------------------------------------------- scopes
    def begin_epoch(self) -> None:
        self._epoch, self._batch, self._metric_objects = _Scope(), None, {}

    def end_epoch(self) -> Dict[str, float]:
        """Values logged in epoch hooks, and every logged Metric computed (then reset)."""
        values = self._epoch.means() if self._epoch is not None else {}
        for name, metric in self._metric_objects.items():
            values[name] = to_float(name, metric.compute())
            metric.reset()
        self._epoch, self._metric_objects = None, {}
        return values

    def begin_batch(self) -> None:
        self._batch = _Scope()

    def end_batch(self) -> tuple:
        """(values logged in the batch, the ``batch_size=`` given to ``self.log`` or None)."""
        scope, self._batch = self._batch, None
        if scope is None:
            return {}, None
        return scope.means(), scope.batch_size

    # --------------------------------------------------------- module API
    def log(self, name: str, value: Any, prog_bar: bool = False, logger: Optional[bool] = None,
            on_step: Optional[bool] = None, on_epoch: Optional[bool] = None,
            reduce_fx: Any = "mean", enable_graph: bool = False, sync_dist: bool = False,
            sync_dist_group: Any = None, add_dataloader_idx: bool = True,
            batch_size: Optional[int] = None, metric_attribute: Optional[str] = None,
            rank_zero_only: bool = False) -> None:
        """``LightningModule.log``'s signature; raysgd uses name, value, batch_size,
        rank_zero_only and reduce_fx (which must average)."""
        if not isinstance(name, str):
            raise ValueError(f"self.log(name, value): name must be a string, got {name!r}.")
        if rank_zero_only and not self._is_global_zero():
            return
        self._check_reduce(name, reduce_fx)
        scope = self._batch if self._batch is not None else self._epoch
        if scope is None:
            self._warn_once(name, f"self.log({name!r}, ...) was called outside train() and "
                                  "validate() (e.g. in setup or configure_optimizers); raysgd "
                                  "reports values logged in step and epoch hooks only, so it is "
                                  "ignored.")
            return
        if batch_size is not None and scope is self._batch:
            scope.batch_size = int(batch_size)
        if is_metric_object(value):
            self._metric_objects[name] = value
            return
        scope.add(name, to_float(name, value))

    def log_dict(self, dictionary: Mapping[str, Any], prog_bar: bool = False,
                 logger: Optional[bool] = None, on_step: Optional[bool] = None,
                 on_epoch: Optional[bool] = None, reduce_fx: Any = "mean",
                 enable_graph: bool = False, sync_dist: bool = False,
                 sync_dist_group: Any = None, add_dataloader_idx: bool = True,
                 batch_size: Optional[int] = None, rank_zero_only: bool = False) -> None:
        for name, value in dict(dictionary).items():
            self.log(name, value, reduce_fx=reduce_fx, batch_size=batch_size,
                     rank_zero_only=rank_zero_only)

    def _check_reduce(self, name: str, reduce_fx: Any) -> None:
        if reduce_fx in ("mean", "avg", torch.mean):
            return
        self._warn_once(("reduce", name),
                        f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): raysgd averages "
                        "logged values over batches and workers (weighted by samples); log a "
                        "value whose mean is what you want.")

    def _warn_once(self, key: Any, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=4)
