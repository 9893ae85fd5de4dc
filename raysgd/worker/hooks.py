"""How the runner calls an operator's ``train_epoch`` and ``validate``.

Two legacy contracts live here, decided once per operator at set-up:

* ``info``: every call's dict carries ``NUM_STEPS``, ``SCHEDULER_STEP``,
  ``USE_FP16`` and ``epoch_idx`` (Ray 1.12's keys and values), with the
  user's own ``info`` on top, so a key the user passes wins.
* ``train_epoch``'s signature: Ray 1.12 called
  ``train_epoch(iterator, info=info, num_steps=num_steps, epoch_idx=epoch_idx)``.
  An override that accepts those keywords (by name or ``**kwargs``) gets
  them; a two-argument ``train_epoch(self, iterator, info)`` keeps working.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, FrozenSet, Optional

from raysgd.constants import EPOCH_IDX, NUM_STEPS, SCHEDULER_STEP, USE_FP16

LEGACY_KEYWORDS = ("num_steps", "epoch_idx")


def call_info(user_info: Optional[dict], num_steps: Optional[int], epoch_idx: int,
              settings: Any) -> Dict[str, Any]:
    """The ``info`` of one call: legacy keys first, the user's keys on top.

    ``epoch_idx`` is what Ray 1.12 passed: the passes over the train loader
    started before this call (so, for ``train()`` calls that each run a whole
    pass, the 0-based index of the pass the call runs).
    """
    info = {NUM_STEPS: num_steps, SCHEDULER_STEP: settings.scheduler_step_freq,
            USE_FP16: settings.use_fp16, EPOCH_IDX: epoch_idx}
    info.update(user_info or {})
    return info


def accepted_keywords(method: Callable) -> FrozenSet[str]:
    """Which of ``num_steps``/``epoch_idx`` ``method`` can take as keywords."""
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: pass nothing extra
        return frozenset()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return frozenset(LEGACY_KEYWORDS)
    keyword_kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params if p.name in LEGACY_KEYWORDS and p.kind in keyword_kinds)


class EpochCaller:
    """Calls one operator's ``train_epoch`` with the keywords its signature takes."""

    def __init__(self, operator: Any):
        self._operator = operator
        self._keywords = accepted_keywords(operator.train_epoch)

    def __call__(self, iterator: Any, info: Dict[str, Any], num_steps: Optional[int],
                 epoch_idx: int) -> Any:
        given = {"num_steps": num_steps, "epoch_idx": epoch_idx}
        extra = {key: given[key] for key in self._keywords}
        return self._operator.train_epoch(iterator, info, **extra)
