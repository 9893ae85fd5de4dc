"""Which Lightning a module comes from: ``pytorch_lightning`` or ``lightning.pytorch``.

raysgd never imports Lightning itself: a user's ``LightningModule`` subclass
already has its Lightning base class in its MRO, so the base is found there
and either package works (both may be installed side by side).
"""
from __future__ import annotations

import importlib.util
import sys
from typing import Any, Optional

from raysgd.errors import ConfigError

PACKAGE_PREFIXES = ("pytorch_lightning.", "lightning.pytorch.")
INSTALL_HINT = "pip install raysgd[lightning]"


def lightning_installed() -> bool:
    """True when ``pytorch_lightning`` or ``lightning`` can be imported (without importing it)."""
    return any(importlib.util.find_spec(name) is not None
               for name in ("pytorch_lightning", "lightning"))


def require_lightning() -> None:
    if not lightning_installed():
        raise ImportError("raysgd.lightning (TrainingOperator.from_ptl) needs PyTorch Lightning "
                          f"2.x, which is not installed; run `{INSTALL_HINT}`.")


def find_base(cls: Any, name: str) -> Optional[type]:
    """Lightning's class called ``name`` (e.g. "LightningModule") in ``cls``'s MRO, or None."""
    for klass in getattr(cls, "__mro__", ()):
        if klass.__name__ == name and klass.__module__.startswith(PACKAGE_PREFIXES):
            return klass
    return None


def check_version(base: type) -> None:
    """Lightning 1.x had another hook and logging API; refuse it with the fix."""
    top = base.__module__.split(".")[0]
    package = "lightning" if top == "lightning" else "pytorch_lightning"
    version = str(getattr(sys.modules.get(package), "__version__", "2"))
    if version.split(".")[0].isdigit() and int(version.split(".")[0]) < 2:
        raise ConfigError(f"TrainingOperator.from_ptl supports Lightning 2.x; {package} {version} "
                          f"is installed. Upgrade it: {INSTALL_HINT}.")


def is_overridden(name: str, obj: Any, base: Optional[type]) -> bool:
    """True when ``obj``'s class defines ``name`` differently from Lightning's ``base``."""
    if obj is None:
        return False
    cls = obj if isinstance(obj, type) else type(obj)
    if base is None or not issubclass(cls, base):
        return hasattr(cls, name)
    return getattr(cls, name, None) is not getattr(base, name, None)
