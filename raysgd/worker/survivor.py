"""Whether a survivor's live state is still where the failed batch found it. No Ray.

A replicated (DDP) rank holds the whole state, so after a rank dies inside ``train()`` the
survivors' live state can be the rollback point instead of the last commit: the run then
re-does only the batch in flight, not the steps since the commit (torchft's lead: survivors
keep their state and a newcomer heals from one of them). That state is exact only if the
failed batch changed nothing of it before the collective it died in, which the runner
checks against a mark it takes at every batch boundary:

* no registered optimizer stepped since the mark (a step post-hook counts them; a batch
  that died in its backward's all-reduce never reached its step);
* the operator's ``global_step`` did not move (the batch did not finish);
* no buffer of a registered model changed (a batch-norm forward updates its running
  statistics before the backward fails);
* RNG draws need no check: every step reseeds them (``raysgd.worker.step_seeds``).

The operator's own ``state_dict`` is handed over as the survivor holds it, like the
schedulers and the scaler, which move only with an optimizer step: code that changes it in
``train_batch`` before the step would count the failed batch twice (the rule is in
docs/guides/fault-tolerance.md). Declined, so the driver restores the commit as before, for a
sharded strategy (a rank's shards are its own) and an optimizer that is not a
``torch.optim.Optimizer`` (its steps cannot be counted).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

import torch


@dataclass(frozen=True)
class BatchMark:
    """A rank at a batch boundary: ``steps`` batches done."""

    steps: int
    position: Dict[str, Any]  # Passes.state_dict() there
    global_step: int
    call_done: int
    optimizer_steps: int
    buffer_versions: int


def _why_not(strategy: Any, optimizers: List[Any]) -> Optional[str]:
    if not getattr(strategy, "replicated", False):
        return "its strategy shards the state, so no other rank holds this rank's part"
    if not all(isinstance(opt, torch.optim.Optimizer) for opt in optimizers):
        return "an optimizer is not a torch.optim.Optimizer, so its steps cannot be counted"
    return None


class SurvivorPoint:
    """Marks every batch boundary and says whether the live state still stands there."""

    def __init__(self) -> None:
        self.why_not: Optional[str] = "no operator yet"
        self._optimizer_steps = 0
        self._buffers: List[torch.Tensor] = []
        self._hooks: list = []
        self._mark: Optional[BatchMark] = None

    def attach(self, strategy: Any, models: List[torch.nn.Module], optimizers: List[Any]) -> None:
        """Decide, once per operator, whether its survivors can serve (module docstring)."""
        self.detach()
        self.why_not = _why_not(strategy, optimizers)
        if self.why_not is None:
            self._hooks = [opt.register_step_post_hook(self._count) for opt in optimizers]
            self._buffers = [buf for model in models for buf in model.buffers()]

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks, self._buffers, self._mark = [], [], None

    def _count(self, *_: Any) -> None:
        self._optimizer_steps += 1

    def _buffer_versions(self) -> int:
        return sum(buf._version for buf in self._buffers)

    def mark(self, steps: int, position: Callable[[], Dict[str, Any]], global_step: int,
             call_done: int) -> None:
        """A batch boundary of ``train()``: ``steps`` batches done."""
        if self.why_not is None:
            self._mark = BatchMark(steps, position(), global_step, call_done,
                                   self._optimizer_steps, self._buffer_versions())

    def clear(self) -> None:
        """The state moved without a batch (a restore, a call's end): no mark holds."""
        self._mark = None

    def standing(self, global_step: int) -> Optional[BatchMark]:
        """The mark the live state still stands at, or None (``reason`` says why)."""
        return self._mark if self.reason(global_step) is None else None

    @property
    def has_buffers(self) -> bool:
        return bool(self._buffers)

    def reason(self, global_step: int) -> Optional[str]:
        """Why the live state is not at the last mark; None when it is."""
        mark = self._mark
        if self.why_not is not None:
            return self.why_not
        if mark is None:
            return "no batch of a train() call was under way"
        if self._optimizer_steps != mark.optimizer_steps:
            return "an optimizer stepped after the last batch boundary"
        if global_step != mark.global_step:
            return "the batch in flight finished"
        if self._buffer_versions() != mark.buffer_versions:
            return "a model buffer changed in the batch in flight (e.g. batch-norm statistics)"
        return None
