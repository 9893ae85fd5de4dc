"""The driver's side of commit slabs (``raysgd.state.slab``): it owns them, and picks
where each between-call commit goes.

A slab is a ``memfd`` the driver creates and keeps open, so a commit in it outlives the
rank that wrote it (a rank that died, a group that was restarted) and is freed with the
trainer (``close``). Only ranks on the driver's node get one: only they can open
``/proc/<driver pid>/fd/<n>``, and a commit there is lost only with the driver itself.
Ranks elsewhere commit to Ray's object store, and are copied as before (``replicas``).

Each rank has two slots, and a commit names one for all ranks (its ``slab_version``
says which version it is). A commit never goes to a slot that holds a commit the driver
still needs: the supervisor's commit, the fallback it keeps while a copy to another
node lands, and every commit the disk writer has not written yet. When both slots are
needed, the commit goes to Ray's object store instead. So a slab is overwritten only when
nothing can read it any more.
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import ray

from raysgd.state.packing import own_copies
from raysgd.state.slab import NAME, SlabTarget, machine_id

SLOTS = 2


def _driver_node() -> Optional[str]:
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None


def _ray_client() -> bool:
    """Under Ray Client this process is not on the cluster: no rank can open its slabs."""
    try:
        from ray.util.client import ray as client
    except ImportError:
        return False
    return client.is_connected()


def no_slabs(nodes: Sequence[str]) -> Tuple[None, List[None]]:
    """Every rank's commit to Ray's store (a group no supervisor gave slabs)."""
    return None, [None] * len(nodes)


def readable_on(nodes: Sequence[str], commit: Any) -> List[List[Any]]:
    """Per rank on ``nodes``, the snapshots it reads ``commit`` from: a rank off the
    driver's node cannot open a slab, so it gets copies in Ray's store of the snapshots that
    are in one (``Commit.slab_ranks``), made on the driver once for all such ranks."""
    snapshots, here = list(commit.snapshots), _driver_node()
    if not commit.slab_ranks or all(node in (here, "local") for node in nodes):
        return [snapshots] * len(nodes)
    copies = [ray.put(own_copies(ray.get(ref))) if rank in commit.slab_ranks else ref
              for rank, ref in enumerate(snapshots)]
    return [snapshots if node in (here, "local") else copies for node in nodes]


def _close_all(files: Dict[Tuple[int, int], int]) -> None:
    for fd in files.values():
        os.close(fd)
    files.clear()


class CommitSlabs:
    def __init__(self) -> None:
        self._files: Dict[Tuple[int, int], int] = {}  # (rank, slot) -> the memfd
        self._holds: List[Optional[int]] = [None] * SLOTS  # the version in each slot
        self._version = 0
        self._machine = machine_id()
        self._closed = not hasattr(os, "memfd_create") or not self._machine  # Linux only
        # A trainer dropped without shutdown() still frees its slabs' memory.
        self._finalizer = weakref.finalize(self, _close_all, self._files)

    def targets(self, nodes: Sequence[str], held: Iterable[Any], here: Optional[str] = None
                ) -> Tuple[Optional[int], List[Optional[SlabTarget]]]:
        """``(version, target per rank)`` for the next between-call commit of ranks running
        on ``nodes``; ``(None, [None, ...])`` where it goes to Ray's store. ``held``: the
        commits (or None) the driver still needs; ``here``: the driver's node."""
        nothing: List[Optional[SlabTarget]] = [None] * len(nodes)
        here = here or _driver_node()
        if self._closed or here is None or here not in nodes or _ray_client():
            return None, nothing
        needed = {getattr(commit, "slab_version", None) for commit in held} - {None}
        slot = next((s for s in range(SLOTS) if self._holds[s] not in needed), None)
        if slot is None:
            return None, nothing
        self._version += 1
        self._holds[slot] = self._version
        pid = os.getpid()
        try:
            return self._version, self._targets(nodes, here, slot, pid)
        except OSError:  # no memfd to be had (descriptors, memory): Ray's store, as before
            return None, nothing

    def _targets(self, nodes: Sequence[str], here: str, slot: int, pid: int):
        return [
            SlabTarget(pid, self._fd(rank, slot), self._version,
                       tuple(self._fd(rank, other) for other in range(SLOTS) if other != slot),
                       self._machine)
            if node == here else None for rank, node in enumerate(nodes)]

    def _fd(self, rank: int, slot: int) -> int:
        key = (rank, slot)
        if key not in self._files:
            self._files[key] = os.memfd_create(f"{NAME}-r{rank}-s{slot}", os.MFD_CLOEXEC)
        return self._files[key]

    def close(self) -> None:
        """Free the slabs (once no rank maps them any more)."""
        self._closed = True
        self._finalizer()


class HeldSlabs:
    """Mixed into :class:`raysgd.driver.supervisor.Supervisor`: its groups' between-call
    commits go to slabs that hold none of the commits it or the disk writer (``kept``)
    still needs."""

    def _init_slabs(self, kept: Optional[Callable[[], Iterable[Any]]]) -> None:
        self.slabs = CommitSlabs()
        self._kept = kept or (lambda: ())

    def _slab_targets(self, nodes: Sequence[str]):
        return self.slabs.targets(nodes, [self.commit, self._fallback, *self._kept()])
