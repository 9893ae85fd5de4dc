"""``self.log`` / ``self.log_dict`` values → raysgd metrics.

A value logged while raysgd runs one batch (the transfer hooks,
``on_train_batch_start``, the step, ``on_*_batch_end``) becomes that batch's
metric: raysgd averages it over the call's batches, weighted by the
``batch_size=`` given to that ``self.log`` call or else the batch's size, then
over the workers, weighted by their samples, and reports the average under the
logged name plus ``last_<name>``. A value Lightning would fork (``on_step`` and
``on_epoch`` both true, given or by the hook's default: ``self.log(name, v,
on_epoch=True)`` in ``training_step``, ``on_step=True`` in ``validation_step``) is
also reported as ``<name>_epoch`` (the average) and ``<name>_step`` (the call's
last batch), the keys Lightning's ``callback_metrics`` and ``logged_metrics`` have;
the plain name stays, as in ``callback_metrics``. ``batch_size=`` weighs only the
value it was logged with. A value logged in an epoch hook (``on_train_epoch_end``, ...) goes
into the call's result as is (then averaged over the workers). A torchmetrics
``Metric`` is computed and reset at the end of the call on every rank (its
``compute()`` syncs across processes). ``rank_zero_only=True`` values come
from rank 0 alone: the other ranks drop them (a ``Metric`` is still computed
there, so the sync never waits for them). Lightning's ``sync_dist`` is not
needed: every metric is reduced across workers on the driver.
"""
from __future__ import annotations

import copy
import numbers
import warnings
from typing import Any, Callable, Dict, FrozenSet, Mapping, NamedTuple, Optional

import torch

from raysgd.worker.batches import map_tensors
from raysgd.worker.metrics import AverageMeter, AverageMeterCollection, is_scalar_tensor

# Keywords of Lightning 1.x's self.log that 2.x dropped: accepted, and ignored but for
# sync_dist_op (which must average, like reduce_fx).
LEGACY_LOG_KEYWORDS = ("sync_dist_op", "tbptt_reduce_fx", "tbptt_pad_token")


def is_metric_object(value: Any) -> bool:
    """A torchmetrics ``Metric`` (duck-typed: raysgd does not import torchmetrics)."""
    return isinstance(value, torch.nn.Module) and all(
        callable(getattr(value, name, None)) for name in ("update", "compute", "reset"))


def to_value(name: str, value: Any) -> Any:
    """One logged value, checked by Lightning's rules for what may be logged: a number as a
    float, a tensor as a detached 0-d float32 copy on its device.

    A tensor is not read here: reading a CUDA tensor makes the CPU wait for the GPU, and a
    step that logs would then wait every batch. The meters sum it where it lives and read it
    once, at the call's summary (:class:`raysgd.worker.metrics.AverageMeter`). It is a copy
    because the module may change its tensor in place after logging it.
    """
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"self.log({name!r}, ...) got a tensor of shape "
                             f"{tuple(value.shape)}; log one number, e.g. value.mean().")
        copied = value.detach().reshape(()).to(torch.float32, copy=True)
        # metrics' own rule: a subclass (e.g. a DTensor) is read now, as before
        return copied if is_scalar_tensor(copied) else float(copied)
    if isinstance(value, numbers.Number):
        return float(value)
    if isinstance(value, Mapping):
        raise ValueError(f"self.log({name!r}, ...) got a dict; use self.log_dict(...) for "
                         "several values (nested dicts cannot be logged).")
    raise ValueError(f"self.log({name!r}, ...) takes a number, a one-element tensor or a "
                     f"torchmetrics Metric, got {type(value).__name__}.")


def to_float(name: str, value: Any) -> float:
    """One logged value read as a float (once per call, e.g. a Metric's ``compute()``)."""
    return float(to_value(name, value))


class Logged(NamedTuple):
    """One batch's logged values, the ``batch_size=`` each was logged with (if any), and the
    names Lightning forks into ``<name>_step`` / ``<name>_epoch``."""

    values: Dict[str, Any]  # floats and 0-d tensors (see to_value)
    batch_sizes: Dict[str, int]
    forked: FrozenSet[str] = frozenset()

    def step_values(self) -> Dict[str, Any]:
        """The batch's values plus ``<name>_step`` for the forked ones (callback_metrics)."""
        return {**self.values, **{f"{name}_step": self.values[name] for name in self.forked
                                  if name in self.values}}


class LoggedMeters(AverageMeterCollection):
    """A call's meters, where each logged value carries its own weight.

    The step's metrics (``train_loss``, ...) are weighted by the batch's
    ``num_samples`` as usual; :meth:`add_logged` weighs each logged value by its
    own ``batch_size=``. Commits snapshot it like any meter collection.
    """

    def __init__(self):
        super().__init__()
        self.logged: Dict[str, AverageMeter] = {}
        self.forked: set = set()
        self.outputs: Optional[list] = None  # training_epoch_end's (raysgd.lightning.v1)

    def __deepcopy__(self, memo: dict) -> "LoggedMeters":
        # An in-epoch commit copies the meters. 1.x step outputs may hold tensors still on the
        # autograd graph (deepcopy refuses those) or on a GPU (a commit may be read on a driver
        # without one), so the copy keeps detached CPU clones of them.
        clone = type(self).__new__(type(self))
        state = {key: value for key, value in self.__dict__.items() if key != "outputs"}
        clone.__dict__.update(copy.deepcopy(state, memo))
        clone.outputs = None if self.outputs is None else map_tensors(
            self.outputs, lambda tensor: tensor.detach().cpu().clone())
        return clone

    def add_logged(self, logged: Logged, num_samples: int) -> None:
        for name, value in logged.values.items():
            weight = logged.batch_sizes.get(name, num_samples)
            self.logged.setdefault(name, AverageMeter()).update(value, n=weight)
        self.forked.update(logged.forked)

    def summary(self) -> Dict[str, Any]:
        stats = super().summary()
        for name, meter in self.logged.items():
            stats[name], stats["last_" + name] = meter.avg, meter.val
            if name in self.forked:
                stats[name + "_epoch"], stats[name + "_step"] = meter.avg, meter.val
        return stats


class _Scope:
    """The values logged in one batch, or in one call's epoch hooks."""

    def __init__(self):
        self.sums: Dict[str, Any] = {}
        self.counts: Dict[str, int] = {}
        self.batch_sizes: Dict[str, int] = {}
        self.forked: set = set()

    def add(self, name: str, value: Any) -> None:
        # Logged twice in one batch (e.g. once per micro-batch): the mean of both, summed in
        # double as a float would be.
        self.sums[name] = value if name not in self.sums else _wide(self.sums[name]) + _wide(value)
        self.counts[name] = self.counts.get(name, 0) + 1

    def means(self) -> Dict[str, Any]:
        return {name: total if self.counts[name] == 1 else total / self.counts[name]
                for name, total in self.sums.items()}


def _wide(value: Any) -> Any:
    return value.double() if isinstance(value, torch.Tensor) else value


class LogCollector:
    """Receives a module's ``self.log`` calls while raysgd runs its hooks."""

    def __init__(self, is_global_zero: Callable[[], bool],
                 phase: Callable[[], Optional[str]] = lambda: None):
        self._is_global_zero = is_global_zero
        self._phase = phase  # "validate" changes Lightning's on_step/on_epoch defaults
        self._batch: Optional[_Scope] = None
        self._epoch: Optional[_Scope] = None
        self._metric_objects: Dict[str, Any] = {}
        self._zero_only: set = set()  # Metric names logged with rank_zero_only=True
        self._forked_metrics: set = set()  # Metric names logged with on_step and on_epoch
        self._warned: set = set()

    # ------------------------------------------------------------- scopes
    def begin_epoch(self) -> None:
        self._epoch, self._batch, self._metric_objects, self._zero_only = _Scope(), None, {}, set()
        self._forked_metrics = set()

    def end_epoch(self) -> Dict[str, float]:
        """Values logged in epoch hooks, and every logged Metric computed (then reset)."""
        # Read now (once per call): the call's results hold numbers.
        values = {name: float(value) for name, value in
                  (self._epoch.means() if self._epoch is not None else {}).items()}
        for name, metric in self._metric_objects.items():
            value = to_float(name, metric.compute())  # on every rank: compute() syncs
            metric.reset()
            if name not in self._zero_only or self._is_global_zero():
                values[name] = value
                if name in self._forked_metrics:
                    values[name + "_epoch"] = value
        self._epoch, self._metric_objects, self._zero_only = None, {}, set()
        return values

    def begin_batch(self) -> None:
        self._batch = _Scope()

    def end_batch(self) -> Logged:
        """The values logged in the batch, with the ``batch_size=`` of each that had one."""
        scope, self._batch = self._batch, None
        if scope is None:
            return Logged({}, {})
        return Logged(scope.means(), dict(scope.batch_sizes), frozenset(scope.forked))

    # --------------------------------------------------------- module API
    def log(self, name: str, value: Any, prog_bar: bool = False, logger: Optional[bool] = None,
            on_step: Optional[bool] = None, on_epoch: Optional[bool] = None,
            reduce_fx: Any = "mean", enable_graph: bool = False, sync_dist: bool = False,
            sync_dist_group: Any = None, add_dataloader_idx: bool = True,
            batch_size: Optional[int] = None, metric_attribute: Optional[str] = None,
            rank_zero_only: bool = False, **legacy: Any) -> None:
        """``LightningModule.log``'s signature (2.x, and 1.x's with its extra keywords); raysgd
        uses name, value, on_step/on_epoch (for the key names), batch_size, rank_zero_only and
        reduce_fx (which must average)."""
        if not isinstance(name, str):
            raise ValueError(f"self.log(name, value): name must be a string, got {name!r}.")
        unknown = sorted(set(legacy) - set(LEGACY_LOG_KEYWORDS))
        if unknown:
            raise TypeError(f"self.log() got unexpected keyword arguments {unknown}.")
        if rank_zero_only and not self._is_global_zero() and not is_metric_object(value):
            return
        self._check_reduce(name, reduce_fx)
        self._check_reduce(name, legacy.get("sync_dist_op") or "mean")
        scope = self._batch if self._batch is not None else self._epoch
        if scope is None:
            self._warn_once(name, f"self.log({name!r}, ...) was called outside train() and "
                                  "validate() (e.g. in setup or configure_optimizers); raysgd "
                                  "reports values logged in step and epoch hooks only, so it is "
                                  "ignored.")
            return
        forked = scope is self._batch and self._forks(on_step, on_epoch)
        if is_metric_object(value):
            self._metric_objects[name] = value
            (self._zero_only.add if rank_zero_only else self._zero_only.discard)(name)
            (self._forked_metrics.add if forked else self._forked_metrics.discard)(name)
            step_value = getattr(value, "_forward_cache", None)  # the batch's value, as Lightning
            if not forked or step_value is None or (rank_zero_only and not self._is_global_zero()):
                return
            value = step_value  # for <name>_step; end_epoch's compute() gives <name>, <name>_epoch
        if forked:
            scope.forked.add(name)
        if batch_size is not None and scope is self._batch:
            scope.batch_sizes[name] = int(batch_size)
        scope.add(name, to_value(name, value))

    def _forks(self, on_step: Optional[bool], on_epoch: Optional[bool]) -> bool:
        """Whether Lightning logs a step value as ``<name>_step`` and ``<name>_epoch``: both on,
        given or by its defaults (a training batch: on_step; a validation batch: on_epoch)."""
        validating = self._phase() == "validate"
        step = (not validating) if on_step is None else on_step
        epoch = validating if on_epoch is None else on_epoch
        return bool(step and epoch)

    def log_dict(self, dictionary: Mapping[str, Any], prog_bar: bool = False,
                 logger: Optional[bool] = None, on_step: Optional[bool] = None,
                 on_epoch: Optional[bool] = None, reduce_fx: Any = "mean",
                 enable_graph: bool = False, sync_dist: bool = False,
                 sync_dist_group: Any = None, add_dataloader_idx: bool = True,
                 batch_size: Optional[int] = None, rank_zero_only: bool = False,
                 **legacy: Any) -> None:
        for name, value in dict(dictionary).items():
            self.log(name, value, on_step=on_step, on_epoch=on_epoch, reduce_fx=reduce_fx,
                     batch_size=batch_size, rank_zero_only=rank_zero_only, **legacy)

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
