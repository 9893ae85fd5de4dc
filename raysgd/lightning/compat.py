"""Which Lightning a module comes from: ``pytorch_lightning`` or ``lightning.pytorch``, and
which version (2.x, or 1.6-1.9 with its own hook signatures).

raysgd never imports Lightning itself: a user's ``LightningModule`` subclass
already has its Lightning base class in its MRO, so the base is found there
and either package works (both may be installed side by side).
"""
from __future__ import annotations

import importlib.util
import re
import sys
from typing import Any, Optional, Tuple

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
                          f"(2.x, or 1.6-1.9), which is not installed; run `{INSTALL_HINT}`.")


def find_base(cls: Any, name: str) -> Optional[type]:
    """Lightning's class called ``name`` (e.g. "LightningModule") in ``cls``'s MRO, or None."""
    for klass in getattr(cls, "__mro__", ()):
        if klass.__name__ == name and klass.__module__.startswith(PACKAGE_PREFIXES):
            return klass
    return None


OLDEST = (1, 6)  # 1.6-1.9 keep the hook API raysgd maps (raysgd.lightning.v1); 2.x is the default


def version_of(base: type) -> Tuple[str, Tuple[int, int]]:
    """The package name and ``(major, minor)`` of the Lightning that defines ``base``."""
    top = base.__module__.split(".")[0]
    package = "lightning" if top == "lightning" else "pytorch_lightning"
    text = str(getattr(sys.modules.get(package), "__version__", "2.0"))
    numbers = [int(part) for part in re.findall(r"\d+", text)[:2]]
    return f"{package} {text}", (tuple(numbers) + (0, 0))[:2]


def check_version(base: type) -> int:
    """The major version of ``base``'s Lightning (1 or 2); refuses anything before 1.6."""
    name, version = version_of(base)
    if version < OLDEST:
        raise ConfigError(f"TrainingOperator.from_ptl supports Lightning 2.x and 1.6-1.9; {name} "
                          f"is installed, whose hooks and logging API differ. Upgrade it: "
                          f"{INSTALL_HINT} (2.x), or pip install 'pytorch_lightning>=1.6,<2'.")
    return version[0]


def is_overridden(name: str, obj: Any, base: Optional[type]) -> bool:
    """True when ``obj``'s class defines ``name`` differently from Lightning's ``base``."""
    if obj is None:
        return False
    cls = obj if isinstance(obj, type) else type(obj)
    if base is None or not issubclass(cls, base):
        return hasattr(cls, name)
    return getattr(cls, name, None) is not getattr(base, name, None)
