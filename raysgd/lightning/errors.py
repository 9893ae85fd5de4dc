"""Errors of the Lightning adapter; both are raysgd errors and keep Python's usual types."""
from __future__ import annotations

from raysgd.errors import ConfigError, RaySGDError


class NotALightningModuleError(ConfigError, TypeError):
    """``from_ptl`` got something other than a ``LightningModule`` subclass.

    A ``ConfigError`` like every bad argument, and a ``TypeError`` as Ray 1.12 raised.
    """


class TrainerAttributeError(RaySGDError, AttributeError):
    """``self.trainer.<name>`` has no raysgd counterpart.

    An ``AttributeError``, so ``getattr(self.trainer, name, default)`` and
    ``hasattr`` keep working in code that probes for optional features.
    """
