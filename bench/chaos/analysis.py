"""A chaos run's figures from rank 0's step log and the events applied: pure, no I/O.

Records are ``(step, wall, pid)`` (:mod:`bench.recovery.steplog`): ``step`` is the global
step count after that step, so a trainer that rolled back to a checkpoint taken after ``c``
steps logs ``c + 1`` next, and the steps between were trained twice.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

Record = Tuple[int, float, int]


def progress(records: Sequence[Record]) -> int:
    """The steps the trainer holds at the end: the last completed step's count."""
    return records[-1][0] if records else 0


def redone_steps(records: Sequence[Record]) -> int:
    """Steps trained more than once: every step logged minus the distinct progress."""
    return max(0, len(records) - progress(records))


def steady_rate(records: Sequence[Record], since: float) -> Optional[float]:
    """Steps per second over the records after ``since`` (None with fewer than two)."""
    late = [record for record in records if record[1] >= since]
    if len(late) < 2 or late[-1][1] <= late[0][1]:
        return None
    return (late[-1][0] - late[0][0]) / (late[-1][1] - late[0][1])


def _rollbacks(records: Sequence[Record]) -> List[Tuple[float, int]]:
    """``(wall, steps re-run)`` of every rollback in the log."""
    found, previous = [], None
    for step, wall, _ in records:
        if previous is not None and step <= previous:
            found.append((wall, previous - (step - 1)))
        previous = step
    return found


def _cause(events: List[Dict[str, Any]], wall: float) -> Optional[int]:
    """Which event a rollback logged at ``wall`` is charged to: the latest one before it,
    passing over preemption notices whose node had not gone yet (a notice alone makes no
    trainer roll back; a kill landing during it does)."""
    before = [i for i, event in enumerate(events) if event["time"] < wall]
    gone = [i for i in before if events[i]["end"] <= wall]
    return (gone or before or [None])[-1]


def _pause(records: Sequence[Record], start: float, stop: float) -> float:
    """The longest time without a completed step from ``start`` to ``stop`` (the next event
    or the window's end; a pause still going on then ends there).

    The longest gap, not the time to the next step: a step in flight when a rank dies may
    still complete on the survivor, and a preempted trainer keeps training until its node
    goes (or it moves off it)."""
    points = [start] + [wall for _, wall, _ in records if start < wall <= stop] + [stop]
    return max(b - a for a, b in zip(points, points[1:]))


def event_figures(records: Sequence[Record], applied: List[Dict[str, Any]],
                  window_end: float) -> List[Dict[str, Any]]:
    """Per landed event: ``pause_s`` (:func:`_pause`, up to the next event) and
    ``redone_steps`` (the rollbacks charged to it, :func:`_cause`)."""
    landed = sorted((e for e in applied if e["landed"]), key=lambda e: e["time"])
    redone = [0] * len(landed)
    for wall, steps in _rollbacks(records):
        cause = _cause(landed, wall)
        if cause is not None:
            redone[cause] += steps
    out = []
    for index, event in enumerate(landed):
        stop = landed[index + 1]["time"] if index + 1 < len(landed) else window_end
        out.append({"kind": event["kind"], "time": event["time"],
                    "pause_s": _pause(records, event["time"], stop),
                    "redone_steps": redone[index]})
    return out


def run_figures(records: Sequence[Record], applied: List[Dict[str, Any]], t0: float,
                window_s: float, global_batch: int) -> Dict[str, Any]:
    """Everything a run reports, from what happened inside its window."""
    window_end = t0 + window_s
    inside = [record for record in records if record[1] <= window_end]
    steady = (steady_rate(inside, t0 + window_s / 2)
              if not any(event["landed"] for event in applied) else None)
    done, redone = progress(inside), redone_steps(inside)
    return {"progress_steps": done, "samples": done * global_batch,
            "logged_steps": len(inside), "redone_steps": redone,
            "redone_samples": redone * global_batch,
            "first_step_s": inside[0][1] - t0 if inside else None,
            "steady_samples_per_s": steady * global_batch if steady else None,
            "restarts": max(0, len({pid for _, _, pid in inside}) - 1),
            "events": event_figures(inside, applied, window_end),
            "events_missed": sum(not event["landed"] for event in applied)}
