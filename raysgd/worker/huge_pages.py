"""Huge pages for a rank's large CPU tensors; no torch and no Ray here.

torch's CPU allocator hands every tensor of 2 MiB or more to the kernel as fresh pages and
gives them back when the tensor goes, so each training step faults in its activations,
gradients and (under FSDP) gathered parameters anew, 4 KiB at a time. On CPU that is most
of a large model's step: FSDP with a 1.6 GB state spends about 75 % of its CPU in the
kernel, and a 256 MB tensor takes 65 536 faults. torch can instead ask for transparent
huge pages (2 MiB each, 512 times fewer faults) when ``THP_MEM_ALLOC_ENABLE=1`` is in its
process's environment at its first allocation; on this project's CPU benchmark FSDP at a
1.6 GB state then runs 1.7 x as fast as a torchrun loop without them (``bench/README.md``,
"Tax benchmark").

So a process a trainer starts sets it before anything imports torch (:func:`enable`, from
the actor's constructor), where the node's kernel offers huge pages on request
(``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``). It is
decided once on the driver (:func:`wanted`): ``RAYSGD_HUGE_PAGES=0`` turns it off, and a
``THP_MEM_ALLOC_ENABLE`` already in a worker's environment is left as it is. It holds for a
process's life: a process kept warm in the pool keeps what it started with. Tensors under
2 MiB, CUDA memory and the driver's own process are not affected.

Why not keep the freed memory in the process instead (glibc's ``mallopt`` with high mmap
and trim thresholds, no faults at all): measured on the tax benchmark's fsdp/medium cell,
it held each step's transients beside the commits, +500 to 800 MiB of peak PSS per run,
for a speed within the runs' spread.
"""
from __future__ import annotations

import logging
import os
import sys

from raysgd.worker.env_switch import switch

logger = logging.getLogger("raysgd")

ENV = "RAYSGD_HUGE_PAGES"
TORCH_ENV = "THP_MEM_ALLOC_ENABLE"  # read by torch's CPU allocator once, at its first use
KERNEL_SWITCH = "/sys/kernel/mm/transparent_hugepage/enabled"


def wanted() -> bool:
    """Whether ranks ask for huge pages, decided on the driver: on unless
    ``RAYSGD_HUGE_PAGES`` says off; a value that is neither raises ``ConfigError``."""
    return switch(os.environ, ENV, on="let ranks allocate large CPU tensors in huge pages",
                  off="keep 4 KiB pages")


def kernel_mode(switch_text: str) -> str:
    """The selected mode in the kernel's switch file (``always [madvise] never``)."""
    for word in switch_text.split():
        if word.startswith("[") and word.endswith("]"):
            return word[1:-1]
    return ""


def kernel_offers(path: str = KERNEL_SWITCH) -> bool:
    """Whether this node's kernel gives huge pages to a process that asks (``always`` or
    ``madvise``); False where it has none, or says ``never``."""
    try:
        with open(path) as handle:
            return kernel_mode(handle.read()) in ("always", "madvise")
    except OSError:
        return False


def enable(want: bool, path: str = KERNEL_SWITCH) -> bool:
    """In a process a trainer starts, before torch is imported: tell torch's allocator to
    ask for huge pages. True if this process's tensors will use them. torch asks only
    where the kernel offers them (where it cannot, torch's request would fail)."""
    if not want or not kernel_offers(path):
        return False
    if "torch" in sys.modules:  # its allocator may have read the variable already
        logger.debug("raysgd: torch was imported before the rank set %s", TORCH_ENV)
        return os.environ.get(TORCH_ENV) == "1"
    os.environ.setdefault(TORCH_ENV, "1")
    return os.environ[TORCH_ENV] == "1"
