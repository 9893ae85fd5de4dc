"""``configure_optimizers()``'s return value → optimizers and scheduler specs. Pure (torch only).

Every form Lightning 2.x documents is accepted, except ``None``:

* an optimizer;
* a list or tuple of optimizers;
* two lists ``([optimizers], [schedulers])`` (a single scheduler in the second slot too);
* a dict ``{"optimizer": o, "lr_scheduler": s_or_dict, "monitor": "metric"}``;
* a list or tuple of such dicts.

A scheduler is a scheduler object or a dict with ``scheduler`` plus optional
``interval`` ("epoch" default, or "step"), ``frequency`` (1), ``monitor``,
``strict`` (True), ``name`` and ``reduce_on_plateau`` (True for
``ReduceLROnPlateau``).

``None`` (Lightning warns and trains without an optimizer) is refused:
raysgd registers the optimizers it steps, checkpoints and restores.
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from raysgd.errors import ConfigError

INTERVALS = ("epoch", "step")
SCHEDULER_KEYS = ("scheduler", "name", "interval", "frequency", "reduce_on_plateau", "monitor",
                  "strict")
OPTIMIZER_DICT_KEYS = ("optimizer", "lr_scheduler", "monitor")
MANUAL_IGNORED_KEYS = ("reduce_on_plateau", "monitor", "strict")
FORMS = ("an optimizer; a list of optimizers; ([optimizers], [schedulers]); "
         "{'optimizer': opt, 'lr_scheduler': sched_or_dict, 'monitor': 'metric'}; "
         "or a list of such dicts")


@dataclass(frozen=True)
class SchedulerSpec:
    """One scheduler and when it steps (the fields of Lightning's ``LRSchedulerConfig``)."""

    scheduler: Any
    name: Optional[str] = None
    interval: str = "epoch"
    frequency: int = 1
    reduce_on_plateau: bool = False
    monitor: Optional[str] = None
    strict: bool = True

    def due(self, count: int) -> bool:
        """Steps at the ``count``-th epoch, or batch of the epoch (1-based), every ``frequency``."""
        return count % self.frequency == 0


def is_optimizer(obj: Any) -> bool:
    if isinstance(obj, torch.optim.Optimizer):
        return True
    return all(hasattr(obj, name) for name in ("step", "zero_grad", "param_groups"))


def parse_optimizers(conf: Any, automatic: bool = True) -> Tuple[list, List[SchedulerSpec]]:
    """The optimizers and scheduler specs of one ``configure_optimizers()`` result."""
    optimizers, schedulers, monitor = _split(conf)
    if not optimizers:
        raise ConfigError(f"configure_optimizers() returned no optimizer ({conf!r}); raysgd needs "
                          f"at least one. Return {FORMS}.")
    if automatic and len(optimizers) > 1:
        raise ConfigError(
            f"configure_optimizers() returned {len(optimizers)} optimizers, but Lightning 2.x "
            "trains several optimizers only with manual optimization, and so does raysgd for "
            "1.x modules (no training_step(batch, batch_idx, optimizer_idx)): set "
            "self.automatic_optimization = False in __init__ and step them in training_step "
            "(opt_a, opt_b = self.optimizers()).")
    specs = [_spec(item, monitor, automatic) for item in schedulers]
    _check_attached(optimizers, specs)
    return list(optimizers), specs


def _split(conf: Any) -> Tuple[list, list, Optional[str]]:
    """(optimizers, schedulers, top-level monitor) of one of the accepted forms."""
    if conf is None:
        raise ConfigError(
            "configure_optimizers() returned None. Lightning then runs without an optimizer, but "
            "raysgd needs one to register (it steps, checkpoints and restores the optimizers). "
            f"Return {FORMS}; a module with nothing to train can return "
            "torch.optim.SGD(self.parameters(), lr=0.0).")
    if is_optimizer(conf):
        return [conf], [], None
    if isinstance(conf, dict):
        return _split_dict(conf)
    if isinstance(conf, (list, tuple)):
        if (len(conf) == 2 and isinstance(conf[0], (list, tuple)) and conf[0]
                and all(is_optimizer(o) for o in conf[0])):
            schedulers = conf[1]
            return list(conf[0]), list(schedulers) if isinstance(schedulers, (list, tuple)) \
                else [schedulers], None
        if conf and all(isinstance(item, dict) for item in conf):
            optimizers, schedulers = [], []
            for item in conf:
                opts, scheds, monitor = _split_dict(item)
                optimizers += opts
                # The dict's monitor belongs to its own scheduler.
                schedulers += [_with_monitor(s, monitor) for s in scheds]
            return optimizers, schedulers, None
        if all(is_optimizer(o) for o in conf):
            return list(conf), [], None
    raise ConfigError(f"configure_optimizers() returned {_describe(conf)}, which is not a "
                      f"form Lightning 2.x documents. Return {FORMS}.")


def _split_dict(conf: dict) -> Tuple[list, list, Optional[str]]:
    if "optimizer" not in conf:
        raise ConfigError(f"configure_optimizers() returned a dict without 'optimizer' (keys: "
                          f"{sorted(conf)}); return {{'optimizer': opt, 'lr_scheduler': sched}}.")
    extra = sorted(set(conf) - set(OPTIMIZER_DICT_KEYS))
    if extra:
        warnings.warn(f"configure_optimizers(): ignoring unsupported keys {extra} of the optimizer "
                      f"dict (Lightning 2.x takes {list(OPTIMIZER_DICT_KEYS)}).", RuntimeWarning,
                      stacklevel=4)
    if not is_optimizer(conf["optimizer"]):
        raise ConfigError(f"configure_optimizers(): 'optimizer' must be a torch optimizer, got "
                          f"{_describe(conf['optimizer'])}.")
    schedulers = [conf["lr_scheduler"]] if conf.get("lr_scheduler") is not None else []
    return [conf["optimizer"]], schedulers, conf.get("monitor")


def _with_monitor(scheduler: Any, monitor: Optional[str]) -> Any:
    if monitor is None:
        return scheduler
    if isinstance(scheduler, dict):
        return {"monitor": monitor, **scheduler}
    return {"scheduler": scheduler, "monitor": monitor}


def _spec(item: Any, monitor: Optional[str], automatic: bool) -> SchedulerSpec:
    fields = dict(item) if isinstance(item, dict) else {"scheduler": item, "monitor": monitor}
    if "scheduler" not in fields:
        raise ConfigError(f"A lr scheduler dict needs the key 'scheduler' (keys: {sorted(fields)}); "
                          "return {'scheduler': sched, 'interval': 'epoch' | 'step'}.")
    unknown = sorted(set(fields) - set(SCHEDULER_KEYS))
    if unknown:
        warnings.warn(f"configure_optimizers(): ignoring unsupported keys {unknown} of a lr "
                      f"scheduler dict (supported: {list(SCHEDULER_KEYS)}).", RuntimeWarning,
                      stacklevel=4)
        fields = {k: v for k, v in fields.items() if k in SCHEDULER_KEYS}
    if not automatic:
        fields = _manual_fields(fields, explicit=isinstance(item, dict))
    _check_fields(fields)
    plateau = isinstance(fields["scheduler"], torch.optim.lr_scheduler.ReduceLROnPlateau)
    fields.setdefault("reduce_on_plateau", plateau and automatic)
    if fields["reduce_on_plateau"] and not fields.get("monitor"):
        raise ConfigError(
            "A ReduceLROnPlateau scheduler needs the metric it watches: return "
            "{'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}} "
            "(any key you self.log or return from training_step/validation_step).")
    return SchedulerSpec(**fields)


def _manual_fields(fields: dict, explicit: bool) -> dict:
    # With manual optimization the user steps schedulers; only interval and
    # frequency stay, as information (Lightning does the same).
    ignored = [k for k in MANUAL_IGNORED_KEYS if k in fields and explicit]
    if ignored:
        warnings.warn(f"configure_optimizers(): keys {ignored} of a lr scheduler dict are ignored "
                      "with manual optimization; call sched.step(...) in training_step.",
                      RuntimeWarning, stacklevel=5)
    return {k: v for k, v in fields.items() if k not in MANUAL_IGNORED_KEYS}


def _check_fields(fields: dict) -> None:
    if fields.get("interval", "epoch") not in INTERVALS:
        raise ConfigError(f"A lr scheduler's 'interval' must be 'epoch' or 'step', got "
                          f"{fields['interval']!r}.")
    frequency = fields.get("frequency", 1)
    if isinstance(frequency, bool) or not isinstance(frequency, numbers.Integral) or frequency < 1:
        raise ConfigError(f"A lr scheduler's 'frequency' must be an integer >= 1, got {frequency!r}.")
    scheduler = fields["scheduler"]
    if not hasattr(scheduler, "step") or not hasattr(scheduler, "state_dict"):
        raise ConfigError(f"A lr scheduler must have step() and state_dict(), got "
                          f"{_describe(scheduler)}.")


def _check_attached(optimizers: list, specs: List[SchedulerSpec]) -> None:
    known = {id(o) for o in optimizers}
    for spec in specs:
        owner = getattr(spec.scheduler, "optimizer", None)
        if owner is not None and id(owner) not in known:
            raise ConfigError(f"The scheduler {type(spec.scheduler).__name__} steps an optimizer "
                              "that configure_optimizers() did not return; return that optimizer "
                              "too, or build the scheduler on one that is returned.")


def _describe(obj: Any) -> str:
    if isinstance(obj, (list, tuple)):
        return f"a {type(obj).__name__} of {[type(item).__name__ for item in obj]}"
    return f"a {type(obj).__name__}"
