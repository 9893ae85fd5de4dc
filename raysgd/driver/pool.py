"""The driver's pool of idle worker processes; pure bookkeeping, no Ray.

Starting a worker process (a Ray actor that imports torch, and DDP's first
import of ``torch._dynamo``) costs seconds; training on one that already runs
costs nothing. So ``trainer.shutdown()`` hands its workers here instead of
killing them, and the next trainer takes them (a crew belongs to one Ray
session). CPU workers are zero-resource processes, so a trainer of any size takes
every idle one it can seat on its nodes (:func:`seat`) and starts only the rest;
GPU workers live in their placement group, so only a trainer of the same shape
(the :class:`Crew` key: resources per worker, count, placement) takes a GPU crew.
A process that imported the operator's module before that file was edited is
never given to a trainer that needs the new code (:func:`code_fits`).
``worker_group.py`` builds crews and ``warm.py`` knows how to stop one; this
module only decides who gets what and when an idle crew is stopped:

* after ``RAYSGD_IDLE_WORKER_TIMEOUT_S`` seconds idle (default 300; 0: no pool);
* when a trainer needs resources an idle crew holds (``release_held``: idle CPU
  processes hold none and stay);
* when its Ray session is gone (``ray.shutdown()``: its actors died with it);
* at interpreter exit.
"""
from __future__ import annotations

import atexit
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, Tuple

from raysgd.constants import env_seconds
from raysgd.errors import ConfigError

logger = logging.getLogger("raysgd")

DEFAULT_IDLE_TIMEOUT_S = 300.0


def idle_timeout_s() -> float:
    """``RAYSGD_IDLE_WORKER_TIMEOUT_S`` from the environment, else 300 s; 0 stops workers at
    ``shutdown()`` (no pool)."""
    value = env_seconds("RAYSGD_IDLE_WORKER_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S)
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"RAYSGD_IDLE_WORKER_TIMEOUT_S={value!r}: use a finite number of "
                          "seconds >= 0 (0 keeps no idle workers).")
    return value


@dataclass
class Crew:
    """The worker processes of one stopped worker group, as one unit.

    ``session`` names the Ray session the actors belong to; ``key`` the shape a
    trainer must ask for to take them; ``stop`` kills them and frees what they
    reserved (only ever called by the pool, once).
    """

    session: Hashable
    key: Hashable
    actors: List[Any]
    spares: List[Any]
    group: Any  # the placement group the crew owns, or None
    held: Dict[str, float] = field(default_factory=dict)  # resources that group reserves
    stop: Callable[["Crew"], None] = field(repr=False, default=lambda crew: None)
    idle_since: float = 0.0
    # The operators' modules these processes imported, by name: their code stamps.
    code: Dict[str, tuple] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return len(self.actors) + len(self.spares)


class WorkerPool:
    """Idle crews of one driver process, waiting for the next trainer."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 timeout_s: Callable[[], float] = idle_timeout_s, schedule: bool = True):
        self._clock = clock
        self._timeout_s = timeout_s
        self._schedule = schedule  # False in unit tests: reap() is called by hand
        self._lock = threading.Lock()
        self._idle: List[Crew] = []
        self._timer: Optional[threading.Timer] = None

    def take(self, session: Hashable, key: Hashable) -> Optional[Crew]:
        """An idle crew of ``key`` in ``session`` (the newest), or None."""
        with self._lock:
            self._drop_other_sessions(session)
            for crew in reversed(self._idle):
                if crew.key == key:
                    self._idle.remove(crew)
                    return crew
        return None

    def take_all(self, session: Hashable, fits: Callable[[Crew], bool]) -> List[Crew]:
        """Every idle crew in ``session`` that ``fits``, oldest first; none is left idle."""
        with self._lock:
            self._drop_other_sessions(session)
            taken = [crew for crew in self._idle if fits(crew)]
            self._idle = [crew for crew in self._idle if crew not in taken]
        return taken

    def give(self, crew: Crew) -> None:
        """Keep ``crew`` idle until a trainer takes it or it times out."""
        timeout = self._timeout_s()
        if timeout <= 0:
            self._stop([crew])
            return
        crew.idle_since = self._clock()
        with self._lock:
            self._drop_other_sessions(crew.session)
            self._idle.append(crew)
        self._arm_for_oldest()

    def release_idle(self, which: Callable[[Crew], bool] = lambda crew: True) -> int:
        """Stop the idle crews ``which`` picks (all by default: a trainer needs the resources
        they hold); returns their workers."""
        with self._lock:
            crews = [crew for crew in self._idle if which(crew)]
            self._idle = [crew for crew in self._idle if crew not in crews]
        self._stop(crews)
        return sum(crew.size for crew in crews)

    def release_held(self) -> int:
        """Stop the idle crews that hold resources (GPU crews keep their placement group),
        which a starting or running trainer needs more; returns their workers."""
        return self.release_idle(lambda crew: bool(crew.held))

    def idle_workers(self, session: Hashable) -> int:
        """Worker processes idle in ``session`` (crews of an ended session are forgotten)."""
        with self._lock:
            self._drop_other_sessions(session)
            return sum(crew.size for crew in self._idle)

    def held(self, session: Hashable) -> Dict[str, float]:
        """Resources the idle crews of ``session`` keep reserved (their placement groups)."""
        total: Dict[str, float] = {}
        with self._lock:
            self._drop_other_sessions(session)
            for crew in self._idle:
                for key, amount in crew.held.items():
                    total[key] = total.get(key, 0.0) + amount
        return total

    def reap(self) -> int:
        """Stop the crews idle for longer than the timeout; returns their workers."""
        deadline = self._clock() - self._timeout_s()
        with self._lock:
            expired = [crew for crew in self._idle if crew.idle_since <= deadline]
            self._idle = [crew for crew in self._idle if crew not in expired]
            left = bool(self._idle)
        self._stop(expired)
        if left:
            self._arm_for_oldest()
        return sum(crew.size for crew in expired)

    def _drop_other_sessions(self, session: Hashable) -> None:
        # Their actors ended with their Ray session; nothing is left to stop.
        self._idle = [crew for crew in self._idle if crew.session == session]

    def _stop(self, crews: List[Crew]) -> None:
        for crew in crews:
            try:
                crew.stop(crew)
            except Exception as exc:  # noqa: BLE001 - an idle crew must never break training
                logger.warning("raysgd: could not stop %d idle worker(s): %r", crew.size, exc)

    def _arm_for_oldest(self) -> None:
        """One timer, due when the longest-idle crew times out (not a full timeout from now)."""
        if not self._schedule:
            return
        with self._lock:
            if not self._idle:
                return
            oldest = min(crew.idle_since for crew in self._idle)
            delay_s = max(0.0, oldest + self._timeout_s() - self._clock())
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(delay_s + 0.1, self.reap)
            self._timer.daemon = True
            self._timer.start()


def code_fits(code: Dict[str, tuple], stamp: tuple) -> bool:
    """Whether processes that imported ``code`` can run the operator of ``stamp`` (its
    module, path, modification time): they did not import that module, or the same file."""
    return code.get(stamp[0], stamp) == stamp


def seat(nodes: Sequence[str], idle: Sequence[Tuple[Any, str]]) -> Tuple[List[Any], List[Any]]:
    """Which idle process takes each seat: ``nodes`` holds each worker's node, ``idle`` the
    ``(process, its node)`` pairs. Returns one process or None per seat (None: start a new
    one there), and the processes left over, in their order."""
    free = list(range(len(idle)))
    seated: List[Any] = []
    for node in nodes:
        index = next((i for i in free if idle[i][1] == node), None)
        if index is not None:
            free.remove(index)
        seated.append(None if index is None else idle[index][0])
    return seated, [idle[i][0] for i in free]


POOL = WorkerPool()
atexit.register(POOL.release_idle)
