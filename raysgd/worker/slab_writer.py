"""A rank's side of commit slabs (``raysgd.state.slab``): copy a packed commit's tensors
into the slab the driver named, and hand back the commit with :class:`SlabTensor` s in
their place. No Ray.

The driver names at most one slab per rank at a time (``raysgd.driver.slabs``): it rides
on a call (``execute_pair``'s last argument) or on a standing ``next_commit`` request, and
the rank keeps it (``offer``) until its next commit large enough for a slab takes it
(``write_pending``), whether that commit is in-epoch (written on the actor's ``commits``
thread while the next batch's forward and backward run) or a call's end. A commit that
finds none goes to Ray's store, as before.

Each slab stays mapped from one commit to the next, so a commit writes over pages that are
already there; ``close`` (the runner's shutdown) unmaps them, so a worker going back to
the pool keeps no commit's memory alive.
"""
from __future__ import annotations

import logging
import mmap
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from raysgd.state.packing import PackedTensor, leaves, map_leaves, pack_tensors
from raysgd.state.slab import (ALIGN, HEADER, HEADER_BYTES, MAGIC, SlabTarget, SlabTensor,
                               check_slab, slab_path)

logger = logging.getLogger("raysgd")

# Below this many bytes a commit goes to Ray's store as before: a slab saves little there,
# and a rank whose commit part is small (a DDP rank but the first) leaves its slab empty.
SLAB_MIN_BYTES = 32 * 2**20


class _Mapped:
    """One slab open and mapped in this process."""

    def __init__(self, path: str):
        self.file = open(path, "r+b", buffering=0)  # noqa: SIM115 - closed in close()
        self.ino = os.fstat(self.file.fileno()).st_ino
        self.size = 0
        self.map: Optional[mmap.mmap] = None

    def reserve(self, size: int) -> bool:
        """Map at least ``size`` bytes; True when the slab grew."""
        if size <= self.size:
            return False
        if self.map is not None:
            self.map.close()
        self.map, self.size = None, 0  # until the new mapping exists (a failure leaves none)
        if os.fstat(self.file.fileno()).st_size < size:
            os.posix_fallocate(self.file.fileno(), 0, size)  # all pages at once, not per fault
        # Populated: every page mapped writable now (0.5 s for 1.6 GB), where a first copy
        # would take a write fault per page (1.2 s).
        self.map = mmap.mmap(self.file.fileno(), size, prot=mmap.PROT_READ | mmap.PROT_WRITE,
                             flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        self.size = size
        return True

    def copy_in(self, offset: int, packed: PackedTensor) -> None:
        if packed.data.nbytes:
            dst = torch.frombuffer(self.map, dtype=torch.uint8, count=packed.data.nbytes,
                                   offset=offset)
            dst.copy_(torch.from_numpy(packed.data))
            del dst  # the map cannot close while a tensor views it

    def mark(self, writing: int, done: int) -> None:
        HEADER.pack_into(self.map, 0, MAGIC, writing, done)

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        self.file.close()


def _layout(tensors: List[PackedTensor]) -> Tuple[Dict[int, int], int]:
    """Each tensor's offset (by ``id``) and the slab size they need."""
    offsets, end = {}, HEADER_BYTES
    for packed in tensors:
        offsets[id(packed)] = end
        end += -(-packed.data.nbytes // ALIGN) * ALIGN
    return offsets, end


class SlabWriter:
    def __init__(self, min_bytes: int = SLAB_MIN_BYTES):
        self.min_bytes = min_bytes
        self._open: Dict[Tuple[int, int], _Mapped] = {}
        self._warned = False
        self._pending: Optional[SlabTarget] = None  # the slab the driver named for the next
        # commit; the training thread (call ends) and the commits thread (in-epoch) share it
        self._lock = threading.Lock()

    def write(self, target: Optional[SlabTarget], state: Any) -> Tuple[Any, bool]:
        """``offer(target)`` and ``write_pending(pack_tensors(state))`` in one (a runner
        does them apart): ``(packed, wrote)``, its tensors copied into ``target``'s slab when
        there is one and they are large enough, else as Ray will store them."""
        self.offer(target)
        packed, _, wrote = self.write_pending(pack_tensors(state))
        return packed, wrote

    def offer(self, target: Optional[SlabTarget]) -> None:
        """The driver names ``target`` for this rank's next commit (None: keep the one it
        named before, if any). A restore keeps it: its slot holds no commit the driver
        needs, and nothing but this rank writes there."""
        if target is not None:
            with self._lock:
                self._pending = target

    def write_pending(self, packed: Any) -> Tuple[Any, Optional[int], bool]:
        """``(state, version, wrote)``: a packed state's tensors copied into the slab the
        driver named, if it is large enough for one; ``version``: the named slab's version
        this commit used up (None if it used none), ``wrote``: whether it is in the slab."""
        tensors: List[PackedTensor] = list(leaves(packed, PackedTensor))
        if sum(t.data.nbytes for t in tensors) < self.min_bytes:
            return packed, None, False  # the slab stays named for a larger commit
        with self._lock:
            target, self._pending = self._pending, None
            if target is None:
                return packed, None, False
            placed = self._place(target, packed, tensors)
        return (placed, target.version, True) if placed is not None else (
            packed, target.version, False)

    def _place(self, target: SlabTarget, packed: Any, tensors: List[PackedTensor]
               ) -> Optional[Any]:
        offsets, size = _layout(tensors)
        try:
            slab = self._slab(target, size)
            slab.mark(target.version, 0)  # a write cut short leaves the slab unreadable
            for tensor in tensors:
                slab.copy_in(offsets[id(tensor)], tensor)
            slab.mark(target.version, target.version)
        except (OSError, ValueError) as exc:  # ValueError: a map a failed grow closed
            self._warn(target, exc)
            return None
        return map_leaves(packed, PackedTensor, lambda t: SlabTensor(
            target.pid, target.fd, slab.ino, target.version, offsets[id(t)], t.data.nbytes,
            t.dtype, t.shape))

    def _slab(self, target: SlabTarget, size: int) -> _Mapped:
        slab = self._mapped(target, target.fd)
        if slab.reserve(size):
            # The other slots grow with it: their first commit, inside a later call, would
            # otherwise pay for their pages; here they are paid where the state first grew
            # (usually the group's start).
            for fd in target.spares:
                self._mapped(target, fd).reserve(size)
        return slab

    def _mapped(self, target: SlabTarget, fd: int) -> _Mapped:
        path, key = slab_path(target.pid, fd), (target.pid, fd)
        slab = self._open.get(key)
        if slab is not None and (slab.map is None or os.stat(path).st_ino != slab.ino):
            slab.close()  # the driver's descriptor now names another slab (a new trainer)
            slab = None
        if slab is None:
            check_slab(target, fd)
            slab = self._open[key] = _Mapped(path)
        return slab

    def _warn(self, target: SlabTarget, exc: OSError) -> None:
        if not self._warned:
            self._warned = True
            logger.warning("raysgd: cannot open the driver's commit slab %s (%s); this rank's "
                           "commits go to Ray's object store instead", target.path, exc)

    def close(self) -> None:
        with self._lock:
            self._pending = None
            for slab in self._open.values():
                slab.close()
            self._open.clear()
