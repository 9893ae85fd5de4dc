"""When each scheduler steps: Lightning's interval/frequency rules, not ``scheduler_step_freq``.

* ``interval="step"`` schedulers step after every ``frequency``-th optimizer
  step that was not skipped (an fp16 overflow skips a step);
* ``interval="epoch"`` schedulers step at the end of every ``frequency``-th
  ``train()`` call (raysgd's epoch);
* a scheduler with a ``monitor`` (``ReduceLROnPlateau``) steps with the
  monitored value averaged over the workers (weighted by their samples), so
  every rank takes the same decision. An epoch-interval one whose metric is
  not among the ``train()`` results waits for the next ``validate()``.

Only automatic optimization steps schedulers; with manual optimization the
user calls ``sched.step()``, as in Lightning. Steps go through the module's
``lr_scheduler_step(scheduler, metric)`` hook, so an override is honoured.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, List, Mapping, Optional

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

    def after_optimizer_step(self, steps_done: int, metrics: Mapping[str, Any]) -> None:
        """After a (not skipped) optimizer step; ``steps_done`` counts it (1-based)."""
        for spec in self.specs:
            if spec.interval == "step" and spec.due(steps_done):
                self._step(spec, metrics, defer=False)

    def after_train(self, metrics: Mapping[str, Any], can_validate: bool) -> None:
        """At the end of a ``train()`` call, with its results."""
        self.epochs_done += 1
        self.pending = []
        for index, spec in enumerate(self.specs):
            if spec.interval == "epoch" and spec.due(self.epochs_done):
                if not self._step(spec, metrics, defer=can_validate):
                    self.pending.append(index)

    def after_validate(self, metrics: Mapping[str, Any]) -> None:
        """At the end of a ``validate()`` call: plateau schedulers waiting for its metrics."""
        waiting, self.pending = self.pending, []
        for index in waiting:
            self._step(self.specs[index], metrics, defer=False)

    def _step(self, spec: SchedulerSpec, metrics: Mapping[str, Any], defer: bool) -> bool:
        """Step ``spec``; False when its metric is missing and it may wait (``defer``)."""
        if not spec.reduce_on_plateau:
            self._step_hook(spec.scheduler, None)
            return True
        value = metrics.get(spec.monitor)
        local = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            else None
        weight = float(metrics.get("num_samples", 1) or 1)
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
