"""What a user hook or creator must return, checked where raysgd consumes the value.

Every refusal is a :class:`~raysgd.errors.ConfigError` with one message format,
``<Class>.<hook> returned <type> (<short repr>); it must return <what>.``, so the user
sees which of their functions returned what, instead of an internal ``TypeError`` from
further down. Raised inside the call on the worker, it is the user's error like any
other: the supervisor does not retry it, rolls every rank back to the last commit and
raises it on the driver, so the trainer stays usable with its state unchanged.

The rules take everything Ray 1.12's loops could use and refuse only what would fail
further down: a metrics dict may hold anything (numbers, numpy scalars and 0-d tensors
are averaged, other values are reported as the last one seen); only ``num_samples``,
which weighs the batch, must be a number. raysgd also accepts ``None`` for "no metrics". The per-batch check is a type test and one dict
lookup; nothing walks the values. No Ray here, and nothing of raysgd's beyond errors,
metrics and dataset_config.
"""
from __future__ import annotations

import numbers
import reprlib
from collections.abc import Mapping
from typing import Any, Callable, Dict, Optional

import torch
from torch import nn

from raysgd.data.dataset_config import is_ray_dataset
from raysgd.errors import ConfigError
from raysgd.worker.metrics import NUM_SAMPLES, to_number

# What each hook must return, as the messages say it.
TRAIN_BATCH = ("a dict of metrics or None, e.g. {'train_loss': loss.item(), "
               "'num_samples': target.size(0)}")
VALIDATE_BATCH = ("a dict of metrics or None, e.g. {'val_loss': loss.item(), "
                  "'num_samples': target.size(0)}")
EPOCH_METRICS = "a dict of metrics or None, e.g. AverageMeterCollection().summary()"
SAMPLE_COUNT = f"'{NUM_SAMPLES}' as a number: the batch's sample count, e.g. target.size(0)"
TRAINING_STEP = ("a loss tensor, a dict holding the loss tensor under 'loss', or None to "
                 "skip the batch (Lightning's rule for automatic optimization)")
TRAINING_STEP_MANUAL = ("a tensor, a dict or None (Lightning's rule for manual "
                        "optimization)")
EXPECTED = {"train_batch": TRAIN_BATCH, "validate_batch": VALIDATE_BATCH,
            "train_epoch": EPOCH_METRICS, "validate": EPOCH_METRICS}

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple = 2, 4, 4, 4


def name_of(owner: Any) -> str:
    """The class name of ``owner`` (an instance or a class); a function's own name; a
    string as it is."""
    if isinstance(owner, str):
        return owner
    if isinstance(owner, type) or (callable(owner) and hasattr(owner, "__code__")):
        return getattr(owner, "__name__", repr(owner))
    return type(owner).__name__


def short_repr(value: Any) -> str:
    """A repr cut to a line (reprlib: big containers are not walked)."""
    try:
        text = _REPR.repr(value)
    except Exception:  # noqa: BLE001 - reprlib catches a broken __repr__; this is a backstop
        text = f"<{type(value).__name__} object>"
    text = " ".join(text.split())
    return text if len(text) <= 80 else text[:77] + "..."


def wrong_return(where: str, value: Any, expected: str, what: str = "") -> ConfigError:
    """The one message: ``<where> returned <what><type> (<repr>); it must return <expected>.``"""
    return ConfigError(f"{where} returned {what}{type(value).__name__} ({short_repr(value)}); "
                       f"it must return {expected}.")


def hook_error(owner: Any, hook: str, value: Any, expected: Optional[str] = None,
               what: str = "") -> ConfigError:
    return wrong_return(f"{name_of(owner)}.{hook}", value, expected or EXPECTED[hook], what)


# ------------------------------------------------------------- operator hooks
def batch_metrics(value: Any, owner: Any, hook: str) -> Dict[str, Any]:
    """A fresh dict of one batch's metrics (``train_batch``/``validate_batch``).

    The caller pops ``num_samples`` from it, so it is always a copy. Called once per
    batch: the common case (a plain dict with an int ``num_samples``) costs a type test,
    a copy and one lookup.
    """
    if type(value) is dict:
        metrics = value.copy()
    elif value is None:
        return {}
    elif isinstance(value, Mapping):
        metrics = dict(value)
    else:
        raise hook_error(owner, hook, value)
    count = metrics.get(NUM_SAMPLES, 1)
    if type(count) is not int:
        metrics[NUM_SAMPLES] = sample_count(count, owner, hook)
    return metrics


def sample_count(value: Any, owner: Any, hook: str) -> Any:
    """``num_samples`` as a Python number (0-d tensors and numpy scalars converted)."""
    number = to_number(value)
    if isinstance(number, numbers.Real) and not isinstance(number, bool):
        return number
    raise hook_error(owner, hook, value, SAMPLE_COUNT, what=f"'{NUM_SAMPLES}': ")


def call_metrics(value: Any, owner: Any, hook: str) -> Dict[str, Any]:
    """A dict of one call's metrics (``train_epoch``/``validate``)."""
    if value is None:
        return {}
    # Ray 1.12 took anything dict() takes (keys() and [] suffice).
    if isinstance(value, Mapping) or (callable(getattr(value, "keys", None))
                                      and hasattr(value, "__getitem__")):
        return dict(value)
    raise hook_error(owner, hook, value)


def training_step(value: Any, owner: Any, automatic: bool, hook: str = "training_step"):
    """Lightning's rule for ``training_step`` (2.x, as 1.6-1.9): ``(loss or None, extras)``.

    Automatic optimization: a tensor, a mapping with a ``'loss'`` tensor, or None (skip).
    Manual optimization: a tensor, any mapping, or None. (``validation_step`` may return
    anything in Lightning 1.x and 2.x alike, so raysgd refuses nothing there.)
    """
    if value is None:
        return None, {}
    if isinstance(value, torch.Tensor):
        return value, {}
    if isinstance(value, Mapping):
        loss = value.get("loss")
        if automatic and loss is None:  # Lightning raises here too
            what = ("whose 'loss' is None" if "loss" in value else
                    f"without a 'loss' (keys: {sorted(map(str, value))})")
            raise ConfigError(
                f"{name_of(owner)}.{hook} returned a dict {what}; with automatic optimization "
                "the dict must hold the loss to backpropagate: return {'loss': loss, ...}, or "
                "return None to skip the batch.")
        if automatic and not isinstance(loss, torch.Tensor):
            raise hook_error(owner, hook, loss, TRAINING_STEP, what="'loss': ")
        return loss, {k: v for k, v in value.items() if k != "loss"}
    raise hook_error(owner, hook, value,
                     TRAINING_STEP if automatic else TRAINING_STEP_MANUAL)


# ------------------------------------------------------------ legacy creators
def _many(check: Callable[[Any], bool], none_ok: bool = False) -> Callable[[Any], bool]:
    def one_or_many(value: Any) -> bool:
        if value is None:
            return none_ok
        items = value if isinstance(value, (list, tuple)) else [value]
        return (none_ok or len(items) > 0) and all(check(item) for item in items)
    return one_or_many


def _has(*methods: str) -> Callable[[Any], bool]:
    # Duck-typed as Ray 1.12 was (it took any optimizer or scheduler object); a class
    # (torch.optim.SGD instead of torch.optim.SGD(...)) has the methods but is not one.
    return lambda value: not isinstance(value, type) and all(
        callable(getattr(value, m, None)) for m in methods)


def _is_loader(value: Any) -> bool:
    if value is None or is_ray_dataset(value):
        return True
    # Iterable without calling iter(): that would start a DataLoader's worker processes.
    return not isinstance(value, (str, bytes, type)) and (
        hasattr(type(value), "__iter__") or hasattr(type(value), "__getitem__"))


def _is_loaders(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return len(value) in (1, 2) and all(_is_loader(item) for item in value)
    return value is not None and _is_loader(value)


def _is_loss(value: Any) -> bool:
    # Ray 1.12 kept whatever came back as the criterion (a custom train_batch may use a dict
    # of losses); only a class is surely a mistake: the default loop would call it with
    # (output, target) and build a module instead of a loss.
    return not isinstance(value, type)


CREATORS: Dict[str, tuple] = {
    "model_creator": (_many(lambda value: isinstance(value, nn.Module)), "a torch.nn.Module, or a list/tuple of them"),
    "optimizer_creator": (_many(_has("step", "zero_grad", "state_dict", "load_state_dict")),
                          "a torch.optim.Optimizer instance, or a list/tuple of them"),
    # Ray 1.12 registered no scheduler for None or [].
    "scheduler_creator": (_many(_has("step", "state_dict", "load_state_dict"), none_ok=True),
                          "a learning-rate scheduler instance (torch.optim.lr_scheduler), "
                          "a list/tuple of them, or None"),
    "loss_creator": (_is_loss, "a loss instance such as nn.MSELoss() (not the class), a "
                               "function (output, target) -> loss, or what your train_batch "
                               "uses as self.criterion"),
    "data_creator": (_is_loaders, "a train loader, or (train_loader, validation_loader) "
                                  "(either may be None; the train loader then comes from "
                                  "trainer.train(dataset=...))"),
}


def creator_result(kind: str, value: Any, creator: Any, owner: Any) -> Any:
    """``value`` if it is what the legacy ``kind`` (e.g. ``"model_creator"``) must return."""
    valid, expected = CREATORS[kind]
    if valid(value):
        return value
    raise wrong_return(f"{name_of(owner)}'s {kind} {name_of(creator)}()", value, expected)
