"""``FailureConfig``: the user's knobs for recovery after worker failures.

Pass it as ``TorchTrainer(failure_config=FailureConfig(...))``; the driver's
:class:`raysgd.driver.recovery.RecoveryPolicy` decides with it.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

from raysgd.errors import ConfigError


@dataclass(frozen=True)
class FailureConfig:
    """Knobs of the recovery policy (all validated here, on the driver)."""

    max_retries: int = 3
    backoff_base_s: float = 1.0
    backoff_cap_s: float = 30.0
    jitter: float = 0.5
    budget_s: float = 600.0
    min_workers: int = 1
    scale_up_cooldown_s: float = 30.0

    def __post_init__(self):
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, numbers.Integral) \
                or self.max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, got {self.max_retries!r}.")
        if isinstance(self.min_workers, bool) or not isinstance(self.min_workers, numbers.Integral) \
                or self.min_workers < 1:
            raise ConfigError(f"min_workers must be an integer >= 1, got {self.min_workers!r}.")
        for name in ("backoff_base_s", "backoff_cap_s", "budget_s", "scale_up_cooldown_s"):
            value = getattr(self, name)
            if not isinstance(value, numbers.Real) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}.")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"jitter must be between 0 and 1, got {self.jitter!r}.")
