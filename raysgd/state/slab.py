"""Commit slabs: a between-call commit's tensors in reused shared memory the driver owns,
instead of new objects in Ray's store. Pure (no Ray); the driver's side is
``raysgd.driver.slabs``, a rank's ``raysgd.worker.slab_writer``.

Why: Ray's store places every object at fresh addresses, so each commit of a large state
faults in new pages (1-4 s of CPU for 1.6 GB, and shared memory grows to 2-3 x the state;
``python -m bench.tax.slab_probe``). A slab is an anonymous shared-memory file
(``memfd``) the driver creates and keeps open; a rank on the driver's node opens it
through ``/proc/<driver pid>/fd/<n>``, maps it once and copies each commit over the last
but one (0.3-0.4 s for 1.6 GB): pages already in place, nothing new allocated.

A slab starts with a header (``HEADER_BYTES``): the version being written and the version
last completed. A writer sets the first, copies, then sets the second; a reader checks
that both equal the version it expects before and after it copies, so a commit whose slab
a newer one overwrote is refused (:class:`raysgd.errors.SlabCommitLost`), never read torn.
The driver never hands out a slab that a commit it still holds lives in (two slots, see
``raysgd.driver.slabs``), so that refusal means a bug, not a lost race.

In a commit, each tensor becomes a :class:`SlabTensor`: a few numbers that pickle small
and read the bytes only when asked (``data``), with the interface of
:class:`raysgd.state.packing.PackedTensor`.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
from dataclasses import dataclass
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import torch

from raysgd.errors import SlabCommitLost

HEADER = struct.Struct("<QQQ")  # magic, version being written, version completed
MAGIC = 0x7261797367645342  # "raysgdSB"
HEADER_BYTES = 4096  # the data starts on its own page
ALIGN = 64  # each tensor's bytes start on a cache line


@dataclass(frozen=True)
class SlabTarget:
    """Where a rank writes one commit: the driver's ``fd`` (process ``pid``) and the
    version the commit gets."""

    pid: int
    fd: int
    version: int
    spares: Tuple[int, ...] = ()  # the rank's other slots: reserved at the same size
    machine: str = ""  # the driver's ``machine_id()``: a pid means nothing on another one

    @property
    def path(self) -> str:
        return slab_path(self.pid, self.fd)


NAME = "raysgd-commit"  # every slab's memfd name starts so (``/proc/.../fd`` shows it)


def slab_path(pid: int, fd: int) -> str:
    return f"/proc/{pid}/fd/{fd}"


def machine_id() -> str:
    """This machine's boot id: two processes share a slab only where it is the same."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def check_slab(target: "SlabTarget", fd: int) -> None:
    """Refuse (``OSError``) a descriptor that is not the driver's slab: another machine's
    pid, or a descriptor number the driver's process no longer uses for one."""
    if not target.machine or target.machine != machine_id():
        raise OSError(f"the driver runs on another machine ({target.machine or 'unknown'})")
    name = os.readlink(slab_path(target.pid, fd))
    if not name.startswith(f"/memfd:{NAME}"):
        raise OSError(f"{slab_path(target.pid, fd)} is {name!r}, not a raysgd slab")


def read_header(fd: int) -> Tuple[int, int]:
    """``(version being written, version completed)`` of the slab open as ``fd``."""
    raw = os.pread(fd, HEADER.size, 0)
    if len(raw) < HEADER.size:
        return 0, 0
    magic, writing, done = HEADER.unpack(raw)
    return (writing, done) if magic == MAGIC else (0, 0)


_reads = threading.local()  # ``maps``: each slab mapped once while ``reading()`` is open


@contextlib.contextmanager
def reading() -> Iterator[None]:
    """Within it, every :attr:`SlabTensor.data` of one slab shares one mapping (a state has
    hundreds of tensors; each would otherwise open and map its slab). On leaving, the
    mappings are dropped; views handed out keep theirs alive until they go."""
    outer = getattr(_reads, "maps", None)
    if outer is None:
        _reads.maps = {}
    try:
        yield
    finally:
        if outer is None:
            _reads.maps = None


@dataclass(frozen=True)
class SlabTensor:
    """A commit's tensor held in a slab: ``nbytes`` bytes at ``offset``, written as
    ``version``; ``ino`` tells the slab from a later file that reuses its descriptor."""

    pid: int
    fd: int
    ino: int
    version: int
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: Tuple[int, ...]

    @property
    def slab(self) -> Tuple[int, int, int, int]:
        """Which slab and version hold the bytes: one :meth:`verify` covers all of its."""
        return self.pid, self.fd, self.ino, self.version

    @property
    def data(self) -> np.ndarray:
        """The bytes, viewed read-only where the slab keeps them (nothing stays mapped once
        the view is dropped and no ``reading()`` is open)."""
        if self.nbytes == 0:
            return np.empty(0, dtype=np.uint8)
        maps: Optional[Dict[tuple, mmap.mmap]] = getattr(_reads, "maps", None)
        if maps is None:
            maps = {}  # outside ``reading()``: this call's own
        mapped = maps.get(self.slab)
        if mapped is None or len(mapped) < self.offset + self.nbytes:
            with self._open() as handle:  # the whole slab: the next tensor is in it too
                mapped = mmap.mmap(handle.fileno(), 0, flags=mmap.MAP_SHARED,
                                   prot=mmap.PROT_READ)
            maps[self.slab] = mapped
        return np.frombuffer(mapped, dtype=np.uint8, count=self.nbytes, offset=self.offset)

    def verify(self) -> None:
        """Raise :class:`SlabCommitLost` unless the slab still holds this version whole;
        called after the bytes were copied, so a copy that raced an overwrite is refused."""
        with self._open():
            pass

    def _open(self):
        path = slab_path(self.pid, self.fd)
        try:
            handle = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by the caller
        except OSError as exc:
            raise SlabCommitLost(
                f"the commit's slab {path} cannot be opened ({exc.strerror}): the driver that "
                "held it is gone, or this process runs on another node") from exc
        stat = os.fstat(handle.fileno())
        writing, done = read_header(handle.fileno())
        if stat.st_ino != self.ino or writing != self.version or done != self.version:
            handle.close()
            raise SlabCommitLost(
                f"the commit of slab version {self.version} was overwritten (the slab holds "
                f"version {done}, {writing} being written); this is a bug in raysgd's choice "
                "of slabs, please report it")
        return handle
