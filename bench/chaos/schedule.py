"""The seeded failure schedule every trainer of a cell gets: pure, no I/O.

Arrivals are a Poisson process (exponential gaps of mean ``mtbf_s``) over the window; each
event draws its kind uniformly from :data:`KINDS` and the rank it hits uniformly from the
ranks. The same seed, rate and window give the same schedule in every process.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import List, Optional, Tuple

KILL, NODE, PREEMPT = "kill", "node", "preempt"
KINDS: Tuple[str, ...] = (KILL, NODE, PREEMPT)
DESCRIPTIONS = {KILL: "SIGKILL of one rank's process",
                NODE: "the node of a rank lost at once",
                PREEMPT: "the node of a rank preempted with notice"}


@dataclass(frozen=True)
class Event:
    at_s: float  # seconds after the trainer's launch
    kind: str
    rank: int


def make_schedule(seed: int, mtbf_s: Optional[float], window_s: float,
                  num_ranks: int = 2) -> List[Event]:
    """The events of one cell; none when ``mtbf_s`` is None (the unfaulted runs)."""
    if mtbf_s is None:
        return []
    if mtbf_s <= 0 or window_s <= 0:
        raise ValueError(f"mtbf_s and window_s must be > 0, got {mtbf_s} and {window_s}")
    rng = random.Random(f"{seed}/{mtbf_s}/{window_s}")
    events, at = [], rng.expovariate(1.0 / mtbf_s)
    while at < window_s:
        events.append(Event(round(at, 3), rng.choice(KINDS), rng.randrange(num_ranks)))
        at += rng.expovariate(1.0 / mtbf_s)
    return events


def describe(events: List[Event]) -> str:
    """One line: ``12.3s kill r1, 40.0s preempt r0, ...`` (``none`` when empty)."""
    return ", ".join(f"{e.at_s:.1f}s {e.kind} r{e.rank}" for e in events) or "none"


def to_args(events: List[Event]) -> str:
    """The schedule as one command-line argument (``from_args`` reads it back)."""
    return ";".join(f"{e.at_s}:{e.kind}:{e.rank}" for e in events)


def from_args(text: str) -> List[Event]:
    events = []
    for part in filter(None, text.split(";")):
        at, kind, rank = part.split(":")
        if kind not in KINDS:
            raise ValueError(f"unknown event kind {kind!r} in {text!r}; choose from {KINDS}")
        events.append(Event(float(at), kind, int(rank)))
    return events
