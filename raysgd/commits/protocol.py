"""The driver's side of the commit protocol as one pure state machine: no Ray, no threads.

Everything the driver must remember about commits lives in :class:`CommitProtocol`: the
newest commit whose every part is safe from any one failure (``current``), newer ones still
waiting for their copies (``pending``), the one kept in case the newest is lost
(``fallback``, the grown rules only), the parts of commits still being assembled, the buffers
named to ranks, and what a rollback past a between-call commit owes (``owed``, the grown
rules only). Callers tell it what happened (a part arrived, a copy
landed, ranks failed, runners were renewed) and get back what to do, as data: a
:class:`Formed` commit whose parts need copies, a :class:`Voided` step, a :class:`Restore`.

Which decisions it takes is :class:`raysgd.commits.rules.Rules`: the grown code and the
target design differ in a few values, and ``tests/commit_sim.py`` plays thousands of fault
schedules against each, checking the invariants after every event.

Words: a *part* is one rank's share of a commit at one step; a *buffer* is one of a rank's
reusable places for parts on the driver's node (today's slabs), named to one owner at a
time; a part in no buffer lives in Ray's store on its rank's node. A part on the driver's
node outlives its rank and the rank's node; any other part needs a copy elsewhere before
losing that node cannot lose it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Dict, List, Optional, Set, Tuple

from raysgd.commits.rules import TARGET, Rules


@dataclass(frozen=True)
class Part:
    """Rank ``rank``'s part of the commit of ``step``. ``buffer``: the version of the
    buffer it went to (None: Ray's store on ``node``); ``ref``: the handle it is read by
    (an object reference). ``void``: the rank found it torn before sending it
    (``Rules.write_check``)."""

    rank: int
    step: int
    node: str
    buffer: Optional[int] = None
    ref: Any = None
    void: bool = False


@dataclass(frozen=True)
class Point:
    """A commit: one part per rank at one step. ``made``: for a commit taken between calls,
    what made it, so that the grown rules can make it again after losing it."""

    step: int
    parts: Tuple[Part, ...]
    between_calls: bool = False
    made: Any = None
    payload: Any = field(default=None, compare=False)  # the caller's commit object

    def buffers(self) -> Set[int]:
        return {part.buffer for part in self.parts if part.buffer is not None}


@dataclass(frozen=True)
class Named:
    """Buffer ``version`` (slot ``slot`` of rank ``rank``), named to ``owner``."""

    rank: int
    slot: int
    version: int
    owner: Any


@dataclass(frozen=True)
class Formed:
    """Every rank's part of ``point`` arrived. ``copies``: the parts to copy to another
    failure domain now; ``current``: whether ``point`` is already the one restored."""

    point: Point
    copies: Tuple[Part, ...]
    current: bool


@dataclass(frozen=True)
class Current:
    """``point`` became the commit a recovery restores (its copies landed)."""

    point: Point


@dataclass(frozen=True)
class Voided:
    """A rank sent ``step``'s part void: no commit forms at that step on any rank."""

    step: int
    rank: int


@dataclass(frozen=True)
class Restore:
    """Restore ``point`` on every rank; ``steps_lost`` beyond the newest commit (a fallback's
    cost); ``catch_up``: what made a lost between-call commit, to do again first (the grown
    rules only). ``point`` is None when no complete commit survives."""

    point: Optional[Point]
    steps_lost: int = 0
    catch_up: Any = None


Decision = Any  # one of Formed, Current, Voided


class CommitProtocol:
    """The driver's commit state for one group of ``world_size`` ranks (see the module)."""

    def __init__(self, world_size: int, driver_node: str, rules: Rules = TARGET,
                 slots: int = 2):
        self.world_size, self.driver_node, self.rules, self.slots = \
            world_size, driver_node, rules, slots
        self.current: Optional[Point] = None
        self.fallback: Optional[Point] = None
        self.pending: List[Point] = []  # oldest first, each newer than ``current``
        self.owed: Any = None  # what a rollback to the fallback must make again
        self.committed_step = -1
        self._forming: Dict[int, Dict[int, Part]] = {}
        self._last_seen: Dict[int, int] = {}
        self._void: Set[int] = set()  # steps a rank sent void: no commit forms there
        self._uncopied: Dict[int, Set[int]] = {}  # pending step -> ranks still uncopied
        self._named: Dict[int, Named] = {}
        self._holds: Dict[Tuple[int, int], int] = {}  # (rank, slot) -> version last named
        self._version = 0

    # -------------------------------------------------------------- buffers
    def needed(self) -> Set[int]:
        """The buffer versions holding a part the driver may still read."""
        keep: Set[int] = set()
        for point in (self.current, self.fallback, *self.pending):
            if point is not None:
                keep |= point.buffers()
        for parts in self._forming.values():
            keep |= {p.buffer for p in parts.values() if p.buffer is not None}
        return keep

    def name(self, rank: int, node: str, process: Any, in_use: Collection[int] = (),
             runner: Any = None) -> Optional[Named]:
        """The buffer to name to ``rank`` with a request: None when it still holds one, when
        it is off the driver's node, or when every slot holds a needed part. ``in_use``: the
        buffer versions the rank reports holding or having unsent parts in (read only under
        ``Rules.buffer_owner="reported"``; the others trust the driver's memory of what it
        named to the rank's ``process``, or to its ``runner`` under "runner")."""
        if self.rules.buffer_owner == "runner":
            process = runner
        if node != self.driver_node:
            return None
        named = self._named.get(rank)
        if self.rules.buffer_owner != "reported":  # the driver's memory of what it named
            if named is not None and named.owner == process:
                return None
            busy: Set[int] = set()
        else:
            if named is not None and named.version in in_use:
                return None
            busy = set(in_use)
        keep = self.needed() | busy
        slot = next((s for s in range(self.slots) if self._holds.get((rank, s)) not in keep),
                    None)
        self._named.pop(rank, None)
        if slot is None:
            return None
        self._version += 1
        self._holds[(rank, slot)] = self._version
        self._named[rank] = Named(rank, slot, self._version, process)
        return self._named[rank]

    def named(self, rank: int) -> Optional[Named]:
        return self._named.get(rank)

    def renewed(self, new_group: bool) -> None:
        """Every rank has a new runner (a replace, a restart), which holds no buffer named
        before. A replace keeps the processes, so keyed on processes the driver goes on
        believing they hold theirs (``Rules.buffer_owner="process"``; "runner" keys
        names on the runner :meth:`name` is told of)."""
        if new_group:
            self._named.clear()
        self._forming.clear()
        self._last_seen.clear()
        self._void.clear()

    # ---------------------------------------------------------------- parts
    def after(self, rank: int) -> int:
        """The step a request for ``rank``'s next part starts after (acknowledging those)."""
        return max(self.committed_step, self._last_seen.get(rank, self.committed_step))

    def arrived(self, part: Part, between_calls: bool = False, made: Any = None
                ) -> List[Decision]:
        named = self._named.get(part.rank)
        if named is not None and part.buffer == named.version:
            del self._named[part.rank]  # used up: the next request names another
        self._last_seen[part.rank] = max(part.step, self._last_seen.get(part.rank, part.step))
        if part.step <= self.committed_step:
            return []
        if part.void:
            self._forming.pop(part.step, None)
            self._void.add(part.step)
            return [Voided(part.step, part.rank)]
        if part.step in self._void:
            return []
        parts = self._forming.setdefault(part.step, {})
        parts[part.rank] = part
        if len(parts) < self.world_size:
            return []
        self.committed_step = part.step
        self._forming = {s: p for s, p in self._forming.items() if s > part.step}
        point = Point(part.step, tuple(parts[r] for r in range(self.world_size)),
                      between_calls, made)
        return [self.formed(point)]

    def formed(self, point: Point) -> Formed:
        """Every rank's part of ``point`` is held (assembled here by :meth:`arrived`, or by
        the driver's watch). It is restorable at once where no part needs a copy; otherwise
        under the target rules once its copies landed (:meth:`copy_landed`)."""
        copies = tuple(p for p in point.parts if p.node != self.driver_node)
        if self.rules.current_when == "assembled":
            self.fallback = self.current if copies else None
            self.owed = None
            self.current = point
            return Formed(point, copies, current=True)
        if not copies:
            self._promote(point)
            return Formed(point, copies, current=True)
        self.pending.append(point)
        self._uncopied[point.step] = {p.rank for p in copies}
        return Formed(point, copies, current=False)

    def copy_landed(self, rank: int, step: int) -> List[Decision]:
        """The copy of ``rank``'s part of ``step`` landed in another failure domain."""
        waiting = self._uncopied.get(step)
        if waiting is None:
            return []
        waiting.discard(rank)
        if waiting:
            return []
        self._promote(next(p for p in self.pending if p.step == step))
        return [Current(self.current)]

    def _promote(self, point: Point) -> None:
        """``point`` is current: older commits are no longer needed."""
        self.current = point
        self.pending = [p for p in self.pending if p.step > point.step]
        self._uncopied = {s: r for s, r in self._uncopied.items() if s > point.step}

    def adopt(self, point: Point) -> None:
        """``point`` is the commit now, held where no failure of a rank can lose it: the
        group's first commit, a resume, or the survivors' live state (``survivors.py``)."""
        self.current, self.fallback, self.pending, self.owed = point, None, [], None
        self._uncopied = {}
        self.committed_step = max(self.committed_step, point.step)
        self._forming = {s: p for s, p in self._forming.items() if s > point.step}

    def may_return(self, step: int) -> bool:
        """Whether the call whose end commit is at ``step`` may return its results: only once
        that commit is the one a recovery restores."""
        return self.current is not None and self.current.step >= step

    # ---------------------------------------------------------------- calls
    def before_call(self, mutates: bool) -> Any:
        """What must be made again before this call runs (and is no longer owed), or None.
        The grown rules owed it only to calls that change state (the driver's catch-up)."""
        if self.owed is None or (not mutates and self.rules.current_when == "assembled"):
            return None
        owed, self.owed = self.owed, None
        return owed

    # ------------------------------------------------------------- recovery
    def restore(self, lost: Callable[[Part], bool]) -> Restore:
        """The commit every rank restores after a failure or a user error: the newest one
        none of whose parts is ``lost`` (its node went before its copy landed), pending ones
        included (the target rules; a rank's death loses no part). Today's rules try the
        newest, then its fallback, and owe what made a lost between-call commit."""
        self._forming.clear()
        if self.rules.current_when == "copied":
            # A pending commit restored stays pending: until its copies land, losing a node
            # may still take it, and the current one is what is left then.
            whole = [p for p in self.pending if not any(lost(q) for q in p.parts)]
            self.pending = whole[-1:]
            self._uncopied = {s: r for s, r in self._uncopied.items()
                              if self.pending and s == self.pending[0].step}
            # The current commit's copies landed: a lost node leaves it whole (a part Ray
            # cannot read all the same is reported with unreadable()).
            return Restore(self.pending[-1] if self.pending else self.current)
        current = self.current
        if current is None or not any(lost(p) for p in current.parts):
            return Restore(current)
        fallback = self.fallback
        if fallback is None or any(lost(p) for p in fallback.parts):
            self.current = self.fallback = None
            return Restore(None)
        self.current, self.fallback = fallback, None
        self.owed = current.made if current.between_calls else None
        return Restore(fallback, current.step - fallback.step, self.owed)

    def unreadable(self, point: Point) -> None:
        """A restore of ``point`` found a part gone that :meth:`restore`'s ``lost`` did not
        know of: it is never chosen again (the next :meth:`restore` takes an older one)."""
        if self.current is point:
            self.current = None
        self.pending = [p for p in self.pending if p is not point]

    def held(self) -> List[Any]:
        """The payloads of every commit a restore may still choose (their buffers stay)."""
        points = [self.current, self.fallback, *self.pending]
        return [p.payload for p in points if p is not None]

    def restored(self, step: int) -> None:
        """Every rank now stands at ``step``: parts of later steps are of a past run."""
        self.committed_step = step
        self._forming.clear()
        self._last_seen.clear()
        self._void.clear()
