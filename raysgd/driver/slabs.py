"""The driver's side of commit slabs (``raysgd.state.slab``): it owns them, and names the
slab each rank's next commit may go to.

A slab is a ``memfd`` the driver creates and keeps open, so a commit in it outlives the
rank that wrote it (a rank that died, a group that was restarted) and is freed with the
trainer (``close``). Only ranks on the driver's node get one: only they can open
``/proc/<driver pid>/fd/<n>``, and a commit there is lost only with the driver itself.
Ranks elsewhere commit to Ray's object store, and are copied as before (``replicas``).

Each rank has two slots. The driver names at most one of them to a rank at a time
(``targets``: with a call, or with a standing in-epoch ``next_commit`` request), and names
another only once the rank's commit reports it used that one up (``consumed``); the rank
keeps the slab named until its next commit large enough for one, in-epoch or a call's
end. A slot is named only when it holds no commit the driver still needs: the
supervisor's commit, the fallback it keeps while a copy to another node lands, every
commit the disk writer has not written yet, and every part of a commit still being
assembled. When both slots are needed, the rank's next commit goes to Ray's object store
instead. So a slab is overwritten only when nothing can read it any more.

Every slab write has a version of its own (``SlabTarget.version``, counted over all
ranks); a :class:`Commit` lists the versions its parts live in (``slab_versions``).
"""
from __future__ import annotations

import os
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

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
        self._holds: Dict[Tuple[int, int], int] = {}  # (rank, slot) -> the version named last
        self._named: Dict[int, Tuple[Any, int, int]] = {}  # rank -> (process, slot, version)
        self.full: Set[int] = set()  # ranks the last targets() found every slot needed for
        self._version = 0
        self._machine = machine_id()
        self._closed = not hasattr(os, "memfd_create") or not self._machine  # Linux only
        # A trainer dropped without shutdown() still frees its slabs' memory.
        self._finalizer = weakref.finalize(self, _close_all, self._files)

    def targets(self, nodes: Sequence[str], held: Iterable[Any], here: Optional[str] = None,
                processes: Optional[Sequence[Any]] = None, ranks: Optional[Sequence[int]] = None,
                needed: Iterable[int] = ()) -> List[Optional[SlabTarget]]:
        """The slab to name to each rank running on ``nodes`` (``ranks``: which of them to
        name one to, default all); None where it goes to Ray's store or still has one named
        (a rank keeps that). ``held``: the commits (or None) the driver still needs;
        ``needed``: more versions it needs (parts of a commit being assembled); ``here``:
        the driver's node; ``processes``: a key per rank's runner (a slab named to a
        runner that is gone is forgotten: ``WorkerGroup.process_keys``)."""
        nothing: List[Optional[SlabTarget]] = [None] * len(nodes)
        here = here or _driver_node()
        if self._closed or here is None or here not in nodes or _ray_client():
            return nothing
        keep = set(needed)
        for commit in held:
            keep.update(getattr(commit, "slab_versions", ()) or ())
        processes = processes if processes is not None else [None] * len(nodes)
        pid = os.getpid()
        out = list(nothing)
        self.full = set()
        for rank in range(len(nodes)) if ranks is None else ranks:
            if nodes[rank] != here:
                continue
            named = self._named.get(rank)
            if named is not None and named[0] == processes[rank]:
                continue  # the rank still has it
            try:
                out[rank] = self._name(rank, processes[rank], keep, pid)
            except OSError:  # no memfd to be had (descriptors, memory): Ray's store, as before
                out[rank] = None
        return out

    def _name(self, rank: int, process: Any, keep: set, pid: int) -> Optional[SlabTarget]:
        self._named.pop(rank, None)
        slot = next((s for s in range(SLOTS) if self._holds.get((rank, s)) not in keep), None)
        if slot is None:
            self.full.add(rank)
            return None
        self._version += 1
        self._holds[(rank, slot)] = self._version
        target = SlabTarget(pid, self._fd(rank, slot), self._version,
                            tuple(self._fd(rank, other) for other in range(SLOTS) if other != slot),
                            self._machine)
        self._named[rank] = (process, slot, self._version)
        return target

    def consumed(self, rank: int, version: Optional[int]) -> None:
        """Rank ``rank``'s commit used up the slab named ``version`` (written or not)."""
        named = self._named.get(rank)
        if version is not None and named is not None and named[2] == version:
            del self._named[rank]

    def forget(self) -> None:
        """No rank keeps a slab named any more (a new group: its runners are new)."""
        self._named.clear()

    def _fd(self, rank: int, slot: int) -> int:
        key = (rank, slot)
        if key not in self._files:
            self._files[key] = os.memfd_create(f"{NAME}-r{rank}-s{slot}", os.MFD_CLOEXEC)
        return self._files[key]

    def close(self) -> None:
        """Free the slabs (once no rank maps them any more)."""
        self._closed = True
        self._finalizer()


class GroupSlabs:
    """What a worker group asks of its supervisor's slabs: where each rank's next commit
    may go (``targets``), and that a commit used a named slab up (``consumed``)."""

    def __init__(self, slabs: Optional[CommitSlabs] = None,
                 held: Callable[[], Iterable[Any]] = lambda: ()):
        self._slabs, self._held = slabs, held

    def targets(self, nodes: Sequence[str], processes: Sequence[Any],
                ranks: Optional[Sequence[int]] = None, needed: Iterable[int] = ()
                ) -> List[Optional[SlabTarget]]:
        if self._slabs is None:
            return [None] * len(nodes)
        return self._slabs.targets(nodes, list(self._held()), processes=processes, ranks=ranks,
                                   needed=needed)

    def full(self) -> Set[int]:
        """The ranks the last ``targets`` named none to because both their slots held a
        commit still needed (not because they are off the driver's node)."""
        return set() if self._slabs is None else set(self._slabs.full)

    def consumed(self, rank: int, version: Optional[int]) -> None:
        if self._slabs is not None:
            self._slabs.consumed(rank, version)

    def used(self, headers: Sequence[dict]) -> None:
        """Every rank's header of one call's commit."""
        for rank, header in enumerate(headers):
            self.consumed(rank, header.get("slab_version"))


NO_SLABS = GroupSlabs()  # a group no supervisor gave slabs: every commit to Ray's store


class HeldSlabs:
    """Mixed into :class:`raysgd.driver.supervisor.Supervisor`: its groups' commits go to
    slabs that hold none of the commits it or the disk writer (``kept``) still needs."""

    def _init_slabs(self, kept: Optional[Callable[[], Iterable[Any]]]) -> None:
        self.slabs = CommitSlabs()
        self._kept = kept or (lambda: ())

    def _group_slabs(self) -> GroupSlabs:
        """For a new group: its runners are new, so none keeps a slab named before."""
        self.slabs.forget()
        return GroupSlabs(self.slabs, lambda: [*(c for c, _ in self.commits.held()),
                                               *self._kept()])
