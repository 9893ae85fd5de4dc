"""When each scheduler steps: Lightning 2.x's rules (its training epoch loop), not
``scheduler_step_freq``.

* ``interval="step"``: Lightning counts the batches of the epoch, so a
  scheduler steps after the batch whose ``(batch_idx + 1) % frequency == 0``,
  ``batch_idx`` being the index ``training_step`` receives (it restarts at 0
  with every pass over the loader). Every batch counts, also one whose
  optimizer step was skipped (``training_step`` returned None, an fp16
  overflow) and the one for which ``on_train_batch_start`` returned -1. A plain
  scheduler steps before ``on_train_batch_end``; a ``ReduceLROnPlateau`` after
  it, with the monitored value read from ``trainer.callback_metrics`` (the
  values of this batch and of the last ``validate()``, so a ``val_*`` monitor
  works once a ``validate()`` ran).
* ``interval="epoch"``: a plain scheduler steps after the last batch of every
  ``frequency``-th ``train()`` call (raysgd's epoch), before
  ``on_train_epoch_end``; a ``ReduceLROnPlateau`` after it, with the call's
  results, or, when its metric is not among them, after the next
  ``validate()`` (Lightning validates before stepping it).
* A monitored value is averaged over the workers (weighted by their samples)
  before the step, so every rank takes the same decision.

Only automatic optimization steps schedulers; with manual optimization the
user calls ``sched.step()``, as in Lightning. Steps go through the module's
``lr_scheduler_step(scheduler, metric)`` hook, so an override is honoured.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

from raysgd.errors import ConfigError
from raysgd.lightning.optim_config import SchedulerSpec

# (value or None, weight) → the mean over workers, or None when no worker had it.
Averager = Callable[[Optional[float], float], Optional[float]]


class SchedulerStepper:
    """Steps a module's schedulers; ``epochs_done`` and ``pending`` are checkpointed state."""

    def __init__(self, specs: List[SchedulerSpec], step_hook: Callable[[Any, Any], None],
                 average: Averager, enabled: bool = True):
        self.specs = list(specs) if enabled else []
        self._step_hook = step_hook
        self._average = average
        self.epochs_done = 0
        self.pending: List[int] = []  # epoch plateau schedulers waiting for validate()

    def _due(self, interval: str, count: int, plateau: bool) -> Iterator[SchedulerSpec]:
        for spec in self.specs:
            if spec.interval == interval and spec.reduce_on_plateau == plateau and spec.due(count):
                yield spec

    def after_batch(self, batch_idx: int) -> None:
        """Plain ``interval="step"`` schedulers, after the batch's optimization."""
        for spec in self._due("step", batch_idx + 1, plateau=False):
            self._step_hook(spec.scheduler, None)

    def after_batch_end(self, batch_idx: int, callback_metrics: Mapping[str, Any],
                        weight: float) -> None:
        """``interval="step"`` plateau schedulers, after ``on_train_batch_end``."""
        for spec in self._due("step", batch_idx + 1, plateau=True):
            self._step(spec, callback_metrics, weight, defer=False)

    def end_of_batches(self) -> None:
        """Plain ``interval="epoch"`` schedulers, after the call's last batch."""
        for spec in self._due("epoch", self.epochs_done + 1, plateau=False):
            self._step_hook(spec.scheduler, None)

    def after_train(self, metrics: Mapping[str, Any], can_validate: bool) -> None:
        """At the end of a ``train()`` call, with its results: epoch plateau schedulers."""
        self.epochs_done += 1
        self.pending = []
        weight = float(metrics.get("num_samples", 1) or 1)
        for index, spec in enumerate(self.specs):
            if spec.interval == "epoch" and spec.reduce_on_plateau and spec.due(self.epochs_done):
                if not self._step(spec, metrics, weight, defer=can_validate):
                    self.pending.append(index)

    def after_validate(self, metrics: Mapping[str, Any]) -> None:
        """At the end of a ``validate()`` call: plateau schedulers waiting for its metrics."""
        waiting, self.pending = self.pending, []
        weight = float(metrics.get("num_samples", 1) or 1)
        for index in waiting:
            self._step(self.specs[index], metrics, weight, defer=False)

    def _step(self, spec: SchedulerSpec, metrics: Mapping[str, Any], weight: float,
              defer: bool) -> bool:
        """Step plateau ``spec``; False when its metric is missing and it may wait (``defer``)."""
        value = metrics.get(spec.monitor)
        if hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            value = value.item()  # callback_metrics hold 0-d tensors, as Lightning's do
        local = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else None
        # Every rank joins the average, even one that lacks the metric, so
        # the collective never hangs and all ranks take the same decision.
        averaged = self._average(local, weight)
        if averaged is None:
            if defer:
                return False
            self._missing(spec, metrics)
            return True
        self._step_hook(spec.scheduler, averaged)
        return True

    def _missing(self, spec: SchedulerSpec, metrics: Mapping[str, Any]) -> None:
        available = sorted(k for k in metrics if not k.startswith("last_"))
        message = (f"ReduceLROnPlateau watches '{spec.monitor}', which no worker reported; "
                   f"available metrics: {available}. self.log('{spec.monitor}', value) in "
                   "training_step or validation_step, or change 'monitor'")
        if spec.strict:
            raise ConfigError(message + " (or set 'strict': False to skip such steps).")
        warnings.warn(message + "; skipping this step because 'strict' is False.", RuntimeWarning,
                      stacklevel=3)

    def state_dict(self) -> Dict[str, Any]:
        return {"epochs_done": self.epochs_done, "pending": list(self.pending)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epochs_done = int(state.get("epochs_done", 0))
        self.pending = list(state.get("pending", []))
