"""One glibc malloc arena for a rank's process; no torch and no Ray here.

Ray runs an actor's methods on threads of its own, never on the process's main thread, and
glibc gives such a thread a malloc arena of its own. Such an arena grows in heaps of at most
64 MiB and unmaps a heap as soon as it empties, where the main arena (a torchrun rank's, a
hand-written loop's) keeps what it freed, up to a threshold that grows with the largest
blocks it sees. A training step allocates and frees the same tensors under 2 MiB (above that
torch maps its own memory, in huge pages: ``raysgd.worker.huge_pages``) at every step, so a
thread's arena makes the kernel fault in and zero their pages again each time. Measured on
the tax benchmark's fsdp/medium cell (``bench/README.md``, "Tax benchmark"): the
hand-written loop moved onto a thread fell from 539-560 to 516-533 samples/s, and raysgd
rose from 495-524 to 560-568 with one arena.

glibc reads ``MALLOC_ARENA_MAX`` once, when the process starts, so the variable travels in
the actor's ``runtime_env`` (:func:`env_vars`): with ``MALLOC_ARENA_MAX=1`` every thread
shares the main arena. Decided once on the driver: ``RAYSGD_ONE_ARENA=0`` turns it off, and
a ``MALLOC_ARENA_MAX`` already in the driver's environment is the user's own choice, so the
workers' is left as Ray gives it. Other C libraries ignore the variable.
"""
from __future__ import annotations

import ctypes
import os
from typing import Dict, Mapping, Optional

from raysgd.worker.env_switch import switch

ENV = "RAYSGD_ONE_ARENA"
GLIBC_ENV = "MALLOC_ARENA_MAX"  # read by glibc's malloc once, at the process's start


def wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ranks start with one malloc arena, decided on the driver: yes unless
    ``RAYSGD_ONE_ARENA`` says no or the driver's environment sets ``MALLOC_ARENA_MAX``; a
    value that is neither yes nor no raises ``ConfigError``."""
    environ = os.environ if environ is None else environ
    wants = switch(environ, ENV, on="start ranks with one malloc arena",
                   off="keep glibc's arena per thread")
    return wants and GLIBC_ENV not in environ


def env_vars(one_arena: bool) -> Dict[str, str]:
    """The variables a rank's process starts with for this setting."""
    return {GLIBC_ENV: "1"} if one_arena else {}


def _glibc() -> Optional[ctypes.CDLL]:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (musl, macOS): nothing to trim
        return None


_LIBC = _glibc()


def trim() -> None:
    """Hand the free pages of the malloc heap back to the system. The main arena keeps
    what it frees (see above), so a rank that swapped a whole state for another (a restore:
    the old model and optimizers, the commit's unpacked copies) would keep that much more
    memory with every failure; measured on the tax benchmark's ddp/medium cell (101 MB of
    state), 50 MB more per kill on the survivor, none with a trim after each restore. Costs
    milliseconds, once per restore; pages reused later are faulted in again."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
