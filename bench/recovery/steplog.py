"""How a recovery variant sees its workers' progress and kills one of them.

Worker side (:class:`StepLog`): every rank writes its pid to ``pid-rank{r}``
when it starts (a restarted worker overwrites it), and rank 0 appends one line
``step wall_time pid`` to ``steps.log`` after every completed optimizer step, and a line
``setup wall_time pid`` each time its operator is set up (a recovery sets every rank up
again, survivors included).
``step`` is the global step count after that step (1 for the first one), so a
run resumed from a commit or checkpoint taken after ``c`` steps logs ``c + 1``
next.

Driver side (:class:`Killer`): a thread that waits until the log shows step
``kill_step``, then SIGKILLs one worker process and notes the wall time.
:func:`analyse` then reads the log: the first step completed after a restore (after
the first set-up that followed the kill; in a log without set-up lines, a new rank-0 pid
or a step count that went back) gives the recovery time (kill → that step) and the steps
re-run (the newest step reached before it minus the step it resumed from). A run that
resumes from the survivors' state re-runs none: its rank 0 keeps its pid and its step
count goes on, which only the set-up line tells apart from a step finished in flight.

Only the standard library here: Ray workers import this module.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

LOG_NAME = "steps.log"

Record = Tuple[int, float, int]  # (step, wall time, pid)


def pid_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"pid-rank{rank}")


def node_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"node-rank{rank}")


def write_text(path: str, text: str) -> None:
    """``text`` into ``path``, replaced whole (a reader never sees half of it)."""
    with open(path + ".tmp", "w") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def read_node(directory: str, rank: int) -> str:
    with open(node_path(directory, rank)) as handle:
        return handle.read()


class StepLog:
    """Worker side: ``log = StepLog(dir, rank)`` in set-up, ``log.completed(step)`` per step."""

    def __init__(self, directory: str, rank: int, node: Optional[str] = None,
                 min_step_s: float = 0.0, floor_after: int = 0):
        self.rank = rank
        # a floor on the time between two completed steps, for the steps after floor_after
        self.min_step_s, self.floor_after = min_step_s, floor_after
        self._last = time.monotonic()
        write_text(pid_path(directory, rank), str(os.getpid()))
        if node is not None:  # the Ray node id, for the preemption variants
            write_text(node_path(directory, rank), node)
        self._handle = open(os.path.join(directory, LOG_NAME), "a") if rank == 0 else None
        self._pid = os.getpid()
        self._line("setup")

    def _line(self, first: object) -> None:
        if self._handle is not None:
            self._handle.write(f"{first} {time.time():.6f} {self._pid}\n")
            self._handle.flush()

    def completed(self, step: int) -> None:
        """``step`` optimizer steps are done: rank 0 logs one short line, flushed at once.
        With ``min_step_s`` every rank first sleeps out what is left of that floor (for steps
        after ``floor_after``)."""
        if self.min_step_s and step > self.floor_after:
            time.sleep(max(0.0, self._last + self.min_step_s - time.monotonic()))
            self._last = time.monotonic()
        self._line(step)


def _lines(directory: str) -> List[List[str]]:
    try:
        with open(os.path.join(directory, LOG_NAME)) as handle:
            return [line.split() for line in handle.read().splitlines()]
    except FileNotFoundError:
        return []


def read_log(directory: str) -> List[Record]:
    """Every complete step line of the step log, in the order written."""
    records = []
    for parts in _lines(directory):
        if len(parts) == 3:
            try:
                records.append((int(parts[0]), float(parts[1]), int(parts[2])))
            except ValueError:
                pass  # a set-up line, or a line cut short by SIGKILL
    return records


def read_setups(directory: str) -> List[float]:
    """The wall times of rank 0's set-ups, in the order written."""
    times = []
    for parts in _lines(directory):
        if len(parts) == 3 and parts[0] == "setup":
            try:
                times.append(float(parts[1]))
            except ValueError:
                pass
    return times


def read_pid(directory: str, rank: int) -> int:
    with open(pid_path(directory, rank)) as handle:
        return int(handle.read())


class Killer(threading.Thread):
    """Waits for ``kill_step`` in the log (and ``ready()``, if given), then SIGKILLs
    ``victim_pid()``, once; not if the log already shows ``final_step`` (a kill after the
    last step measures no recovery, so it is an error instead)."""

    def __init__(self, directory: str, kill_step: int, victim_pid: Callable[[], int],
                 ready: Optional[Callable[[], bool]] = None, deadline_s: float = 600.0,
                 poll_s: float = 0.002, final_step: Optional[int] = None):
        super().__init__(daemon=True, name="bench-killer")
        self.directory = directory
        self.kill_step = kill_step
        self.final_step = final_step
        self.victim_pid = victim_pid
        self.ready = ready
        self.deadline_s = deadline_s
        self.poll_s = poll_s
        self.kill_time: Optional[float] = None
        self.step_at_kill: Optional[int] = None
        self.victim: Optional[int] = None
        self.error: Optional[str] = None

    def run(self) -> None:
        deadline = time.monotonic() + self.deadline_s
        while time.monotonic() < deadline:
            records = read_log(self.directory)
            if records and records[-1][0] >= self.kill_step and (
                    self.ready is None or self.ready()):
                if self.final_step is not None and records[-1][0] >= self.final_step:
                    self.error = (f"training reached its last step ({self.final_step}) "
                                  "before the kill could land")
                    return
                try:
                    self.victim = self.victim_pid()
                    self.step_at_kill = records[-1][0]
                    self.kill_time = time.time()
                    os.kill(self.victim, signal.SIGKILL)
                except (OSError, ValueError) as exc:
                    self.error = f"could not kill the worker: {exc!r}"
                return
            time.sleep(self.poll_s)
        self.error = f"step {self.kill_step} not reached within {self.deadline_s:.0f}s"


def analyse(records: List[Record], kill_time: float,
            setups: Optional[List[float]] = None) -> Dict[str, Optional[float]]:
    """Recovery time and steps re-run, from the step log and the kill's wall time.

    The first step completed after the restore is the first record after the first
    set-up that followed ``kill_time`` (``setups``: :func:`read_setups`); without set-up
    lines, the first record after ``kill_time`` that comes from another rank-0 process
    than the one running at the kill, or whose step count is not above the previous
    record's.
    """
    before = [r for r in records if r[1] <= kill_time]
    old_pid = before[-1][2] if before else None
    previous = before[-1][0] if before else 0
    reached = previous
    set_up = next((wall for wall in setups or () if wall > kill_time), None)
    for step, wall, pid in records[len(before):]:
        restored = wall > set_up if set_up is not None else pid != old_pid or step <= previous
        if restored:
            return {"recovery_s": wall - kill_time, "resumed_from_step": step - 1,
                    "last_step_before_restore": reached, "steps_rerun": reached - (step - 1)}
        previous = reached = step  # the old rank 0 finished a step already in flight
    return {"recovery_s": None, "resumed_from_step": None, "last_step_before_restore": reached,
            "steps_rerun": None}
