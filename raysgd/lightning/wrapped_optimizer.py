"""What ``self.optimizers()`` returns: raysgd's counterpart of Lightning's ``LightningOptimizer``."""
from __future__ import annotations

from typing import Any, Callable, Optional


class OperatorOptimizer:
    """A torch optimizer whose ``step`` goes through the operator.

    ``step(closure)`` runs the closure, then the operator's step: gradients
    averaged over the workers when DDP did not do it, fp16 loss scale removed,
    ``on_before_optimizer_step``, clipping (automatic optimization), and the
    precision-aware ``optimizer.step()``. Everything else (``param_groups``,
    ``state_dict()``, ...) is the wrapped optimizer's.
    """

    def __init__(self, optimizer: Any, step_fn: Callable[[Any, bool], None]):
        self._optimizer = optimizer
        self._step_fn = step_fn

    @property
    def optimizer(self) -> Any:
        """The wrapped torch optimizer (Lightning's ``LightningOptimizer.optimizer``)."""
        return self._optimizer

    def step(self, closure: Optional[Callable[[], Any]] = None, **kwargs: Any) -> Any:
        result = closure() if closure is not None else None
        # A closure that returned None (training_step returned None) skips the step.
        self._step_fn(self._optimizer, closure is not None and result is None)
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_optimizer", "_step_fn"):
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"OperatorOptimizer({self._optimizer!r})"
