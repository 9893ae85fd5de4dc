"""A seeded simulation of the commit protocol under random fault schedules (issue 70).

The driver is :class:`raysgd.commits.protocol.CommitProtocol`; this module plays everything
around it as data: ranks that train in lock-step (a batch's collective needs every rank),
offer commits every ``interval`` steps, hand them over through the driver's standing
requests and wait as the rules say; transfers and copies that land late; and faults: a
killed rank, a lost node, a user error, a preemption notice, a write outside an optimizer
step, slow acknowledgements and a driver that stops polling. Each tick picks one enabled
event at random; the invariants are checked at the events that can break them (a restore,
a buffer's write, a request, a read), and a broken one raises :class:`Violation` with its
seed and the schedule so far.

The state is a number per rank: its live state is "the state after ``step`` optimizer
steps", so a part's content is the step it holds, or ``TORN`` when the live state changed
while it was copied. A restore reads each part where it lives (a buffer's current content,
or Ray's store on a node that is alive or whose copy landed) and must find the commit's
step in every one.

Invariants (``Violation.kind``):
- ``torn_restore``: a restore read a part that is not the commit's step (torn, overwritten).
- ``no_commit``: a restore found no complete commit, or went past a newer one still whole.
- ``buffer_overwritten``: a part was written over a buffer holding a part still needed.
- ``buffer_lost``: a request names no buffer to a rank on the driver's node that holds none
  while one of its slots is free: that commit takes fresh memory (today: every commit of
  that rank, for the group's life, which is memory that grows with each failure).
- ``lost_work``: a recovery went back more than two intervals and the step in flight
  (one commit in flight, one interval, one step), or a preemption lost any step.
- ``stale_read``: a reading call (``validate``, ``state_dict``, ``save``) after a
  ``train()`` call returned saw an older state than that call's end.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from collections import Counter
from typing import Dict, List, Optional, Tuple

from raysgd.commits.protocol import CommitProtocol, Formed, Named, Part, Point, Voided
from raysgd.commits.rules import Rules

TORN = -1
DRIVER = "D"
KINDS = ("torn_restore", "no_commit", "buffer_overwritten", "buffer_lost", "lost_work",
         "stale_read")


class Violation(AssertionError):
    def __init__(self, kind: str, detail: str, seed: int, trace: List[str]):
        self.kind, self.detail, self.seed, self.trace = kind, detail, seed, trace
        tail = "\n  ".join(trace[-25:])
        super().__init__(f"{kind}: {detail} (seed {seed}; replay with "
                         f"simulate({seed}, rules)); last events:\n  {tail}")


@dataclass(frozen=True)
class Mix:
    """How often each fault is drawn, per tick (the rest is training and the driver)."""

    kill: float = 0.01
    node_loss: float = 0.005
    user_error: float = 0.005
    stray_write: float = 0.0
    notice: float = 0.005
    pause: float = 0.01  # the driver stops polling (a GC pause, a debugger, a slow host)
    slow_ack: float = 0.02  # a rank's wait for the driver's word runs out meanwhile
    second: float = 0.1  # per recovery: another failure before it restores

    def scaled(self, **changes: float) -> "Mix":
        return Mix(**{**self.__dict__, **changes})


@dataclass
class Transfer:
    """A part on its way to the driver (taken, not yet arrived)."""

    part: Part
    content: Optional[int]  # None: a view, read from the live state when it lands
    writes: int  # the rank's write count when the view was taken


@dataclass
class Rank:
    rank: int
    node: str
    process: int
    runner: int
    alive: bool = True
    step: int = 0  # the live state: optimizer steps done
    in_batch: bool = False  # forward and backward of batch ``step + 1`` under way
    writes: int = 0  # writes of the live state (optimizer steps and stray writes)
    clean: int = 0  # ``writes`` at its last optimizer step: a stray write since shows
    offered: int = 0  # the last step it offered a part of (or started at)
    queue: List[Tuple[int, Part, Optional[int], int]] = field(default_factory=list)
    inflight: Optional[Transfer] = None
    storing: Optional[int] = None  # a view taken, not acknowledged
    landing: Optional[int] = None  # any part taken, not acknowledged
    local: Optional[Tuple[int, Part, int]] = None  # a buffer snapshot being copied
    target: Optional[Named] = None
    request: Optional[int] = None  # a standing request: the step it starts after
    known_current: int = -1  # the current commit's step, as the last request said
    views: bool = True
    again: bool = False
    unchecked: Optional[Tuple[int, int]] = None  # (step, writes) of a view not yet checked
    stopped: bool = False


class World:
    def __init__(self, seed: int, rules: Rules, mix: Mix = Mix()):
        self.seed, self.rules, self.mix = seed, rules, mix
        self.rng = random.Random(seed)
        rng = self.rng
        self.size = rng.choice([2, 2, 3])
        self.interval = rng.choice([1, 2, 3])
        self.replicated = rng.random() < 0.6  # DDP: the survivors' live state is a commit
        spots = rng.choice([[DRIVER], ["A"], [DRIVER, "A"], ["A", "B"], [DRIVER, "A", "B"]])
        self.nodes_alive = {DRIVER, "A", "B", "C"}
        self.ranks = [Rank(r, spots[r % len(spots)], process=r, runner=r)
                      for r in range(self.size)]
        self._ids = self.size
        self.proto = CommitProtocol(self.size, DRIVER, rules)
        self.trace: List[str] = []
        self.counts: Counter = Counter()  # what happened: events, restores, catch-ups, voids
        # Ground truth of what each part holds: (rank, step, buffer or node) -> content.
        self.store: Dict[int, Tuple[str, int]] = {}  # Ray's store: ref -> node, content
        self.copied: set = set()  # refs of store parts with a copy on the driver's node
        self.copying: List[Part] = []
        self.slots: Dict[Tuple[int, int], Tuple[int, int]] = {}  # (rank, slot) -> version, content
        self.ever_current: List[Point] = []
        self.formed: List[Point] = []  # commits formed since the last restore
        self.paused = False
        self.in_call = False
        self.call_end = 0
        self.returned = 0  # the end step of the last train() call that returned
        self.calls_left = rng.randint(2, 4)
        self.ends: List[int] = []  # call-end parts produced: ranks that finished the call
        self.stop_at: Optional[int] = None
        self.noticed: Optional[str] = None
        self.stop_parts = False  # the stop's parts were handed over
        self.voids = 0
        self._start()

    # ------------------------------------------------------------- helpers
    def fail(self, kind: str, detail: str) -> None:
        raise Violation(kind, detail, self.seed, self.trace)

    def log(self, text: str) -> None:
        self.trace.append(text)

    def live(self) -> List[Rank]:
        return [r for r in self.ranks if r.alive]

    def _new_id(self) -> int:
        self._ids += 1
        return self._ids

    def _write_part(self, rank: Rank, step: int, content: Optional[int]) -> Part:
        """A part of ``step``: into the buffer the rank holds, else Ray's store on its node."""
        target, rank.target = rank.target, None
        part = Part(rank.rank, step, rank.node, target.version if target else None,
                    self._new_id())
        if target is not None:
            previous = self.slots.get((rank.rank, target.slot))
            if previous is not None and previous[0] in self.proto.needed() - {target.version}:
                self.fail("buffer_overwritten", f"rank {rank.rank} wrote buffer version "
                          f"{target.version} over version {previous[0]}, still needed")
            self.slots[(rank.rank, target.slot)] = (target.version, TORN if content is None
                                                    else content)
        return part

    def _land_content(self, part: Part, content: int) -> None:
        if part.buffer is not None:
            slot = self._slot_of(part)
            if slot is not None and self.slots[slot][0] == part.buffer:
                self.slots[slot] = (part.buffer, content)
        else:
            self.store[part.ref] = (part.node, content)

    def _slot_of(self, part: Part) -> Optional[Tuple[int, int]]:
        for (rank, slot), (version, _) in self.slots.items():
            if rank == part.rank and version == part.buffer:
                return rank, slot
        return None

    def readable(self, part: Part) -> Optional[int]:
        """What a restore reads for ``part`` now; None if it is gone."""
        if part.buffer is not None:
            slot = self._slot_of(part)
            return None if slot is None else self.slots[slot][1]
        held = self.store.get(part.ref)
        if held is None:
            return None
        node, content = held
        if node in self.nodes_alive or part.ref in self.copied:
            return content
        return None

    def lost(self, part: Part) -> bool:
        return self.readable(part) is None

    def _decisions(self, decisions: list) -> None:
        for decision in decisions:
            if isinstance(decision, Formed):
                self.log(f"formed step {decision.point.step} current={decision.current}")
                self.formed.append(decision.point)
                self.copying += list(decision.copies)
                if decision.current:
                    self.ever_current.append(decision.point)
            elif isinstance(decision, Voided):
                self.voids += 1
                self.counts["voided"] += 1
                self.log(f"voided step {decision.step}")
            else:  # Current
                self.log(f"current step {decision.point.step}")
                self.ever_current.append(decision.point)

    # ---------------------------------------------------------- group start
    def _start(self) -> None:
        """The group's first commit (step 0), held by the driver."""
        parts = tuple(Part(r.rank, 0, DRIVER, ref=self._new_id()) for r in self.ranks)
        for part in parts:
            self.store[part.ref] = (DRIVER, 0)
        point = Point(0, parts, between_calls=True, made=("start", 0))
        self.proto.adopt(point)
        self.ever_current.append(point)

    # ---------------------------------------------------------------- ranks
    def _due(self, rank: Rank) -> bool:
        step = rank.step
        return step > rank.offered and step < self.call_end and \
            (step % self.interval == 0 or rank.again)

    def _blocked(self, rank: Rank) -> Optional[str]:
        """What a rank at a batch boundary waits for, if anything."""
        if rank.stopped:
            return "stop"
        if not rank.in_batch:
            if self._due(rank) and self.rules.unacknowledged == "wait" and \
                    rank.known_current < rank.offered:
                return "current"  # one commit in flight at most
            if rank.landing is not None and rank.step > rank.landing:
                return "ack"
            return None
        if any(r.step + (1 if r.in_batch else 0) < rank.step + 1 for r in self.ranks):
            return "collective"  # a peer is behind (or dead)
        if not all(r.alive for r in self.ranks):
            return "collective"
        if rank.storing is not None:
            return "ack"
        return None

    def progress(self, rank: Rank) -> None:
        if not rank.in_batch:
            if self.stop_at is not None and rank.step == self.stop_at:
                rank.stopped = True
                self.log(f"rank {rank.rank} stops at {rank.step}")
                return
            if self._due(rank):
                self._offer(rank)
                return
            if rank.step >= self.call_end:
                return
            rank.in_batch = True
            return
        self._settle(rank)
        rank.step += 1
        rank.writes += 1
        rank.clean = rank.writes
        rank.in_batch = False

    def _offer(self, rank: Rank) -> None:
        step = rank.step
        rank.offered, rank.again = step, False
        if self.rules.snapshot == "view" and rank.views:
            part = self._write_part(rank, step, None)
            rank.queue.append((step, part, None, rank.writes))
            rank.unchecked = (step, rank.writes)
        elif self.rules.snapshot == "buffer" and rank.views:
            part = self._write_part(rank, step, None)
            rank.local = (step, part, rank.writes)  # copied beside the next forward
        else:
            part = self._write_part(rank, step, step)
            rank.queue.append((step, part, step, rank.writes))
        self.log(f"rank {rank.rank} offers {step} ({'buffer ' + str(part.buffer) if part.buffer else 'store'})")

    def local_done(self, rank: Rank) -> None:
        step, part, writes = rank.local
        rank.local = None
        torn = rank.writes != writes
        if torn and self.rules.write_check == "before_sent":
            part = Part(part.rank, part.step, part.node, part.buffer, part.ref, void=True)
            rank.views = False  # its commits copy at the boundary from now on
        self._land_content(part, TORN if torn else step)
        rank.queue.append((step, part, TORN if torn else step, writes))

    def _settle(self, rank: Rank) -> None:
        """Before an optimizer step: what today's settle and the buffer's wait do."""
        if rank.local is not None:
            self.local_done(rank)
        if rank.unchecked is not None:
            step, writes = rank.unchecked
            rank.unchecked = None
            if rank.writes != writes:  # a write outside a step: seen only now
                rank.views, rank.again = False, True
        for i, (step, part, content, writes) in enumerate(rank.queue):
            if content is None:  # a queued view gets its own copy now
                value = step if rank.writes == writes else TORN
                self._land_content(part, value)
                rank.queue[i] = (step, part, value, writes)

    def stray_write(self, rank: Rank) -> None:
        """User code writes parameters outside an optimizer step (in a forward, say)."""
        rank.writes += 1

    def timeout(self, rank: Rank) -> None:
        """The rank's wait for the driver's word ran out."""
        if self.rules.unacknowledged == "train_on":
            rank.storing = rank.landing = None
            self.counts["trained on"] += 1
            self.log(f"rank {rank.rank} trains on unacknowledged")

    # --------------------------------------------------------------- driver
    def request(self, rank: Rank) -> None:
        after = self.proto.after(rank.rank)
        rank.request = after
        current = self.proto.current
        rank.known_current = current.step if current is not None else -1
        if rank.storing is not None and after >= rank.storing:
            rank.storing = None
        if rank.landing is not None and after >= rank.landing:
            rank.landing = None
        named = self.proto.name(rank.rank, rank.node, rank.process, self.in_use(rank),
                                rank.runner)
        if named is not None:
            rank.target = named
        elif rank.node == DRIVER and not self.in_use(rank) and self._free_slot(rank):
            self.fail("buffer_lost", f"rank {rank.rank} holds no buffer and one of its slots "
                      "is free, but the driver named it none: its commits take fresh memory")

    def _free_slot(self, rank: Rank) -> bool:
        needed = self.proto.needed()
        held = [self.slots.get((rank.rank, s)) for s in range(self.proto.slots)]
        return any(h is None or h[0] not in needed for h in held)

    @staticmethod
    def in_use(rank: Rank) -> set:
        """The buffer versions the rank's runner holds or has unsent parts in."""
        parts = [q[1] for q in rank.queue]
        parts += [rank.inflight.part] if rank.inflight is not None else []
        parts += [rank.local[1]] if rank.local is not None else []
        held = {p.buffer for p in parts if p.buffer is not None}
        return held | ({rank.target.version} if rank.target is not None else set())

    def take(self, rank: Rank) -> None:
        after, rank.request = rank.request, None
        rank.queue = [q for q in rank.queue if q[0] > after]
        step, part, content, writes = rank.queue.pop(0)
        rank.inflight = Transfer(part, content, writes)
        if content is None:
            rank.storing = step
        rank.landing = step

    def arrive(self, rank: Rank) -> None:
        transfer, rank.inflight = rank.inflight, None
        part = transfer.part
        content = transfer.content
        if content is None:  # a view: read from the live state as it is now
            content = part.step if transfer.writes == rank.writes else TORN
        self._land_content(part, content)
        self.log(f"rank {rank.rank}'s part {part.step} arrives "
                 f"({'torn' if content == TORN else 'whole'}{', void' if part.void else ''})")
        self._decisions(self.proto.arrived(part))

    def copy_lands(self, part: Part) -> None:
        self.copying.remove(part)
        held = self.store.get(part.ref)
        if held is None or held[0] not in self.nodes_alive:
            return  # its node went first: the copy never lands
        self.copied.add(part.ref)
        self._decisions(self.proto.copy_landed(part.rank, part.step))

    # ---------------------------------------------------------------- calls
    def begin_call(self) -> None:
        self._catch_up(self.proto.before_call(mutates=True))
        self.in_call, self.calls_left = True, self.calls_left - 1
        self.call_end = self.ranks[0].step + self.rng.randint(3, 7)
        self.ends = []
        for rank in self.ranks:
            rank.offered = rank.step  # the call's start is committed
        self.log(f"train() to step {self.call_end}")

    def _catch_up(self, owed) -> None:
        if owed is None:
            return
        kind, step = owed
        self.log(f"catch-up: {kind} again to step {step}")
        self.counts["catch-up"] += 1
        for rank in self.ranks:
            rank.step, rank.writes = step, rank.writes + 1
        self._between_call_commit(step, made=owed)

    def _between_call_commit(self, step: int, made) -> None:
        for rank in self.ranks:
            part = self._write_part(rank, step, step)
            self._land_content(part, step)
            self._decisions(self.proto.arrived(part, between_calls=True, made=made))

    def end_rank(self, rank: Rank) -> None:
        """The call's end on one rank: it settles, and its end part is the call's return."""
        self._settle(rank)
        if rank.storing is not None:
            if self.rules.unacknowledged == "wait":
                return  # settles once acknowledged
            rank.storing = None
        self.ends.append(rank.rank)
        part = self._write_part(rank, self.call_end, self.call_end)
        self._land_content(part, self.call_end)
        self._decisions(self.proto.arrived(part, between_calls=True,
                                           made=("train", self.call_end)))

    def return_call(self) -> None:
        self.in_call, self.returned = False, self.call_end
        self.log(f"train() returns at step {self.call_end}")
        for rank in self.ranks:  # the next call's requests release this call's
            rank.request, rank.landing, rank.queue = None, None, []

    def read(self) -> None:
        self._catch_up(self.proto.before_call(mutates=False))
        seen = self.ranks[0].step
        self.log(f"a reading call sees step {seen}")
        if seen < self.returned:
            self.fail("stale_read", f"a reading call saw step {seen} after train() returned "
                      f"step {self.returned}")

    # ------------------------------------------------------------- failures
    def kill(self, rank: Rank) -> None:
        rank.alive = False
        rank.inflight = None
        self.log(f"rank {rank.rank} killed")

    def lose_node(self, node: str) -> None:
        self.nodes_alive.discard(node)
        self.log(f"node {node} lost")
        for rank in self.ranks:
            if rank.node == node and rank.alive:
                self.kill(rank)

    def recover(self, user_error: bool = False) -> None:
        reached = max(r.step for r in self.ranks)
        survivors = self.live()
        self.stop_at, self.noticed, self.stop_parts = None, None, False
        if not user_error and self.replicated and self.in_call:
            self._from_survivors(survivors)
        new_group = (user_error and self.rng.random() < 0.5) or self.rng.random() < 0.2
        if self.rng.random() < self.mix.second:  # a second failure while the newcomers start
            second = self.rng.choice(self.ranks)
            if second.node != DRIVER and self.rng.random() < 0.5:
                self.lose_node(second.node)
            else:
                self.kill(second)
            new_group = True  # the replace failed: every rank restarts
            self.counts["second failure"] += 1
        for rank in self.ranks:
            if not rank.alive:
                rank.alive, rank.process = True, self._new_id()
                if rank.node not in self.nodes_alive:
                    rank.node = self.rng.choice(sorted(self.nodes_alive))
            if new_group:
                rank.process = self._new_id()
            if new_group or not user_error:  # a replace sets every rank up anew
                rank.runner, rank.target = self._new_id(), None
        self.proto.renewed(new_group=new_group)
        self._restore(reached, f"{'user error' if user_error else 'failure'}")

    def _from_survivors(self, survivors: List[Rank]) -> None:
        steps = {r.step for r in survivors}
        current = self.proto.current
        if any(r.writes != r.clean for r in survivors):
            return  # a write outside a step: the live state is no step's state
        if not survivors or len(steps) != 1 or current is None or steps == {current.step}:
            return
        step = steps.pop()
        if step < current.step:
            return
        parts = tuple(Part(r, step, DRIVER, ref=self._new_id()) for r in range(self.size))
        for part in parts:
            self.store[part.ref] = (DRIVER, step)
        point = Point(step, parts)
        self.proto.adopt(point)
        self.ever_current.append(point)
        self.log(f"survivors' live state at step {step} is the commit")
        self.counts["survivors"] += 1

    def _restore(self, reached: int, why: str) -> None:
        choice = self.proto.restore(self.lost)
        point = choice.point
        if point is None:
            self.fail("no_commit", f"no complete commit to restore after a {why}")
        for part in point.parts:
            content = self.readable(part)
            if content != point.step:
                self.fail("torn_restore", f"restoring step {point.step}, rank {part.rank}'s "
                          f"part holds {'a torn copy' if content == TORN else content}")
        newest = max((p for p in self.ever_current + self.formed
                      if all(self.readable(q) == p.step for q in p.parts)),
                     key=lambda p: p.step, default=None)
        if newest is not None and newest.step > point.step:
            self.fail("no_commit", f"restored step {point.step} with step {newest.step}'s "
                      "commit still whole")
        self.formed = []
        self.log(f"restore step {point.step} after a {why}")
        self.counts["restore after a " + why] += 1
        self.counts["fallback"] += bool(choice.steps_lost)
        for rank in self.ranks:
            rank.step, rank.writes, rank.in_batch = point.step, rank.writes + 1, False
            rank.offered, rank.queue, rank.inflight = point.step, [], None
            rank.storing = rank.landing = rank.request = rank.local = rank.unchecked = None
            rank.again, rank.stopped, rank.known_current = False, False, point.step
            rank.clean = rank.writes
        self.proto.restored(point.step)
        if self.in_call:
            self._catch_up(self.proto.before_call(mutates=True))
        self.ends = []
        bound = (2 + self.voids) * self.interval + 1
        if reached - self.ranks[0].step > bound:
            self.fail("lost_work", f"went back from step {reached} to {self.ranks[0].step}, "
                      f"more than {bound}")
        self.voids = 0

    def notice(self) -> None:
        """A node that holds ranks is to be drained: stop at one agreed step."""
        self.stop_at = max(r.step for r in self.ranks) + 1
        self.noticed = self.rng.choice(sorted({r.node for r in self.ranks}))
        self.log(f"notice for node {self.noticed}: stop at step {self.stop_at}")

    def hand_over(self) -> None:
        """Every rank stopped: their parts are the commit, the noticed node's ranks move."""
        step = self.stop_at
        if not self.stop_parts:
            self.stop_parts = True
            for rank in self.ranks:
                part = self._write_part(rank, step, step)
                self._land_content(part, step)
                self._decisions(self.proto.arrived(part))
        if self.proto.current is None or self.proto.current.step < step:
            return  # moves once the stop's commit is current
        for rank in self.ranks:
            if rank.node == self.noticed and self.noticed != DRIVER:
                rank.process = self._new_id()
                rank.node = self.rng.choice(sorted(self.nodes_alive - {self.noticed}))
            rank.runner, rank.target = self._new_id(), None
        self.proto.renewed(new_group=False)
        self.stop_at, self.noticed, self.stop_parts = None, None, False
        self._restore(step, "hand-over")
        if self.ranks[0].step != step:
            self.fail("lost_work", f"a preemption notice lost steps: stopped at {step}, "
                      f"resumed at {self.ranks[0].step}")

    # -------------------------------------------------------------- checks
    # ----------------------------------------------------------------- loop
    def events(self) -> List[Tuple[float, str, object]]:
        mix, out = self.mix, []
        live = self.live()
        dead = len(live) < self.size
        if not self.in_call:
            if dead:
                return [(1.0, "recover", None)]
            if self.calls_left <= 0:
                return []
            out += [(1.0, "begin", None), (0.5, "read", None)]
            out += [(mix.kill, "kill", r) for r in live]
            out += [(mix.node_loss, "lose", n) for n in sorted({r.node for r in live} - {DRIVER})]
            out += [(2.0, "copy", key) for key in self.copying]
            return out
        if dead:
            out.append((0.3, "recover", None))
        if self.stop_at is not None and all(r.stopped for r in live) and not dead:
            out.append((1.0, "hand_over", None))
        if len(self.ends) == self.size and self.proto.may_return(self.call_end):
            out.append((1.0, "return", None))
        for rank in live:
            blocked = self._blocked(rank)
            at_end = not rank.in_batch and rank.step >= self.call_end and not self._due(rank)
            if blocked is None and at_end:
                if rank.rank not in self.ends and not dead:
                    out.append((1.0, "end", rank))
            elif blocked is None:
                out.append((1.0, "progress", rank))
            if blocked in ("ack", "current"):
                out.append((mix.slow_ack, "timeout", rank))
            if rank.local is not None:
                out.append((1.0, "local", rank))
            if not self.paused and rank.inflight is None:
                if rank.request is None:
                    out.append((0.7, "request", rank))
                elif any(q[0] > rank.request for q in rank.queue):
                    out.append((1.0, "take", rank))
                else:
                    out.append((0.1, "request", rank))  # the long poll renewed
            if rank.inflight is not None:
                out.append((0.7, "arrive", rank))
            out += [(mix.kill, "kill", rank), (mix.user_error, "user_error", rank),
                    (mix.stray_write, "stray", rank)]
        out += [(0.5, "copy", key) for key in self.copying]
        out += [(mix.node_loss, "lose", n) for n in sorted({r.node for r in live} - {DRIVER})]
        if self.stop_at is None and not dead:
            out.append((mix.notice, "notice", None))
        out.append((0.2 if self.paused else mix.pause, "pause", None))
        return out

    def run(self, max_ticks: int = 3000) -> "World":
        for _ in range(max_ticks):
            events = self.events()
            if not events:
                return self
            weights = [w for w, _, _ in events]
            _, name, arg = self.rng.choices(events, weights)[0]
            self._do(name, arg)
        return self

    # The events whose method has another name.
    HANDLERS = {"end": "end_rank", "local": "local_done", "copy": "copy_lands",
                "lose": "lose_node", "stray": "stray_write", "begin": "begin_call",
                "return": "return_call"}

    def _do(self, name: str, arg) -> None:
        self.counts[name] += 1
        if name not in ("progress", "request", "take", "arrive", "copy", "local"):
            self.log(f"{name} {getattr(arg, 'rank', arg) if arg is not None else ''}".strip())
        handler = getattr(self, self.HANDLERS.get(name, name))
        handler() if arg is None else handler(arg)

    def user_error(self, rank: Rank) -> None:
        self.in_call = False  # the call raises; the next one starts from the commit
        self.recover(user_error=True)

    def pause(self) -> None:
        self.paused = not self.paused


def simulate(seed: int, rules: Rules, mix: Mix = Mix()) -> World:
    """Play schedule ``seed`` under ``rules``; raises :class:`Violation` on a broken
    invariant."""
    return World(seed, rules, mix).run()


def first_violation(rules: Rules, seeds: range, mix: Mix = Mix(),
                    kind: Optional[str] = None) -> Optional[Violation]:
    """The first schedule of ``seeds`` that breaks an invariant (of ``kind``, if given)."""
    for seed in seeds:
        try:
            simulate(seed, rules, mix)
        except Violation as violation:
            if kind is None or violation.kind == kind:
                return violation
    return None
