"""On/off settings that the driver reads from its environment for the processes a trainer
starts (``RAYSGD_HUGE_PAGES``, ``RAYSGD_ONE_ARENA``); no torch and no Ray here."""
from __future__ import annotations

from typing import Mapping

from raysgd.errors import ConfigError

_ON, _OFF = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def switch(environ: Mapping[str, str], name: str, on: str, off: str) -> bool:
    """Whether ``name`` is on in ``environ`` (unset or empty: on, the default). A value that is
    neither on nor off raises ``ConfigError`` saying what 1 (``on``) and 0 (``off``) do."""
    value = environ.get(name, "").strip().lower()
    if not value or value in _ON:
        return True
    if value in _OFF:
        return False
    raise ConfigError(f"{name}={environ[name]!r}: use 1 to {on} (the default) or 0 to {off}.")
