"""The scheduling priority a trainer's processes run at; no torch and no Ray here.

Ray starts every worker process at a low priority (niceness 15, its ``worker_niceness``)
so that its own daemons stay responsive. A torchrun rank runs at its launcher's
priority. Where training fills a machine's cores, whatever else runs there (Ray's
daemons, the driver) takes its CPU from ranks at niceness 15 first, and from ranks at the
driver's niceness only its fair share. So a process a trainer starts or seats runs at the
driver's niceness (:func:`rank_niceness`, decided once on the driver) until the trainer
releases it, and an idle process in the pool at Ray's. Spares and newcomers run at the
ranks' niceness too: a newcomer for a preempted node must be warm by the deadline, so it
competes with training as an equal rather than waiting behind it.

Raising a priority needs privilege (root, ``CAP_SYS_NICE`` or a high enough
``RLIMIT_NICE``); without it a process stays at Ray's and logs why. Where the OS has no
niceness (Windows) nothing is set.
``RAYSGD_RANK_NICENESS`` overrides the target: an integer, or ``ray`` to keep Ray's.
"""
from __future__ import annotations

import logging
import os
from typing import List, Optional

from raysgd.errors import ConfigError

logger = logging.getLogger("raysgd")

ENV = "RAYSGD_RANK_NICENESS"
KEEP_RAYS = "ray"


def rank_niceness() -> Optional[int]:
    """The niceness ranks train at, decided on the driver: ``RAYSGD_RANK_NICENESS`` if set
    (``ray``: None, keep Ray's), else the driver's own."""
    value = os.environ.get(ENV, "").strip()
    if not hasattr(os, "getpriority"):
        return None
    if not value:
        return os.getpriority(os.PRIO_PROCESS, 0)
    if value.lower() == KEEP_RAYS:
        return None
    try:
        nice = int(value)
    except ValueError:
        nice = None
    if nice is None or not -20 <= nice <= 19:
        raise ConfigError(f"{ENV}={value!r}: use an integer niceness from -20 to 19, or "
                          f"'{KEEP_RAYS}' to keep Ray's worker niceness.")
    return nice


def current() -> Optional[int]:
    """The niceness of the process's main thread (what Ray set; threads may differ)."""
    return os.getpriority(os.PRIO_PROCESS, os.getpid()) if hasattr(os, "getpriority") else None


def _threads() -> List[int]:
    # Linux keeps a niceness per thread and a new thread inherits its creator's, so every
    # thread that exists is set (torch's pools, gloo's, Ray's own); elsewhere the process's.
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def set_niceness(nice: Optional[int]) -> bool:
    """Set every thread of this process to ``nice``; False (and a log line) where the OS
    refuses a raise of priority, or has no niceness. Threads that end meanwhile are skipped."""
    if nice is None or current() is None:
        return False
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            continue
        except PermissionError:
            logger.info("raysgd: this rank stays at niceness %d: raising it to %d needs root, "
                        "CAP_SYS_NICE or RLIMIT_NICE (set %s=ray to keep Ray's and not try)",
                        current(), nice, ENV)
            return False
    return True
