"""From the runs of every cell to the figures, the breakdown and the targets: pure.

A cell is one trainer at one failure rate (``mtbf`` None: unfaulted). Goodput divides a
run's distinct samples by what unfaulted torchrun trains in the same window at its steady
rate (the median over its unfaulted runs).
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

TRAINERS = ("raysgd", "raytrain", "torchrun", "torchft")
LABELS = {"raysgd": "raysgd", "raytrain": "Ray Train", "torchrun": "torchrun",
          "torchft": "torchft"}
LOST_NODE_BAR_S = 3.0  # a lost node's median pause (issue 48)


def stats(values: List[float]) -> Optional[Dict[str, float]]:
    """median, min, max, n (None when there are no values)."""
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def cell_key(trainer: str, mtbf: Optional[float]) -> str:
    return f"{trainer}@{'none' if mtbf is None else f'{mtbf:g}s'}"


def steady_rate(cells: Dict[str, List[Dict[str, Any]]], trainer: str) -> Optional[float]:
    """``trainer``'s unfaulted steady samples/s (median over its runs), None without one."""
    found = stats([r["steady_samples_per_s"] for r in cells.get(cell_key(trainer, None), [])
                   if r["ok"] and r.get("steady_samples_per_s")])
    return found["median"] if found else None


def baseline_rate(cells: Dict[str, List[Dict[str, Any]]]) -> Optional[float]:
    """Unfaulted torchrun's steady samples/s: the goodput denominator."""
    return steady_rate(cells, "torchrun")


def goodput(run: Dict[str, Any], baseline: Optional[float]) -> Optional[float]:
    if not run["ok"] or not baseline:
        return None
    return run["samples"] / (baseline * run["window_s"])


def _step_s(cells, trainer: str, baseline: Optional[float], batch: int) -> Optional[float]:
    """Seconds per step unfaulted: the trainer's own steady rate, else torchrun's."""
    rate = steady_rate(cells, trainer) or baseline
    return batch / rate if rate else None


def breakdown(runs: List[Dict[str, Any]], step_s: Optional[float]) -> Dict[str, Dict[str, Any]]:
    """Per event kind over ``runs``: how many landed, the pauses, the steps redone and the
    time lost (pause plus the redone steps at the unfaulted step time)."""
    out = {}
    events = [event for run in runs if run["ok"] for event in run["events"]]
    for kind in sorted({event["kind"] for event in events}):
        mine = [event for event in events if event["kind"] == kind]
        redone = sum(event["redone_steps"] for event in mine)
        lost = [event["pause_s"] + (event["redone_steps"] * step_s if step_s else 0.0)
                for event in mine]
        out[kind] = {"events": len(mine), "pause_s": stats([e["pause_s"] for e in mine]),
                     "redone_steps": redone, "lost_s_total": sum(lost),
                     "lost_s_per_event": sum(lost) / len(mine)}
    return out


# Where a run's goodput went, in goodput units (they add up to 1 - goodput); see shortfall().
SHORTFALL_PARTS = ("rate", "start", "events", "rest")


def shortfall(run: Dict[str, Any], baseline: Optional[float],
              own_rate: Optional[float]) -> Optional[Dict[str, float]]:
    """Split a run's 1 - goodput: ``rate``, training at the trainer's own unfaulted steady
    rate ``own_rate`` instead of torchrun's ``baseline`` the whole window; ``start``, the
    window before its first step; ``events``, each event's pause and redone steps (at its own
    rate); ``rest``, what none of these explains (slower stretches after a recovery, the
    machine's drift; negative when the run went faster than the unfaulted one). None
    without both rates or a first step."""
    if not run["ok"] or not baseline or not own_rate or run.get("first_step_s") is None:
        return None
    window, scale = run["window_s"], own_rate / baseline
    parts = {"rate": 1.0 - scale,
             "start": run["first_step_s"] / window * scale,
             "events": (sum(event["pause_s"] for event in run["events"]) / window * scale
                        + run["redone_samples"] / (baseline * window))}
    parts["rest"] = 1.0 - goodput(run, baseline) - sum(parts.values())
    return parts


def shortfall_parts(runs: List[Dict[str, Any]], baseline: Optional[float],
                    own_rate: Optional[float]) -> Dict[str, Any]:
    """Each part of :func:`shortfall` over ``runs`` (median [min-max]); empty without any."""
    found = [parts for run in runs if (parts := shortfall(run, baseline, own_rate))]
    if not found:
        return {}
    return {part: stats([parts[part] for parts in found]) for part in SHORTFALL_PARTS}


# The parts of a recovery raysgd reports (``recovery_stats.recovery_phases``), in path order.
RECOVERY_PARTS = ("detect_s", "survivors_s", "replace_s", "restart_s", "restore_s", "backoff_s",
                  "first_step_s", "other_s", "total_s")


def recovery_parts(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Each part's median [min-max] over every recovery the trainer reported in ``runs`` (a
    part a recovery did not run counts 0 s); empty when it reported none."""
    phases = [phase for run in runs
              for phase in (run.get("reported") or {}).get("recovery_phases", [])]
    if not phases:
        return {}
    return {"recoveries": len(phases),
            **{part: stats([phase.get(part, 0.0) for phase in phases]) for part in RECOVERY_PARTS}}


def summarize_cells(cells: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """Every cell's figures (medians with min–max over its runs) and breakdown."""
    baseline = baseline_rate(cells)
    out = {}
    for key, runs in cells.items():
        good = [run for run in runs if run["ok"]]
        trainer = key.split("@")[0]
        batch = good[0]["global_batch"] if good else 0
        out[key] = {
            "goodput": stats([g for run in good if (g := goodput(run, baseline)) is not None]),
            "samples": stats([run["samples"] for run in good]),
            "redone_samples": stats([run["redone_samples"] for run in good]),
            "first_step_s": stats([run["first_step_s"] for run in good
                                   if run.get("first_step_s") is not None]),
            "steady_samples_per_s": stats([run["steady_samples_per_s"] for run in good
                                           if run.get("steady_samples_per_s")]),
            "pause_s": stats([e["pause_s"] for run in good for e in run["events"]]),
            "events_landed": sum(len(run["events"]) for run in good),
            "events_missed": sum(run["events_missed"] for run in good),
            "trainer_errors": sum(bool(run.get("trainer_error")) for run in runs),
            "runs": len(runs), "ok_runs": len(good),
            "breakdown": breakdown(good, _step_s(cells, trainer, baseline, batch)),
            "shortfall": shortfall_parts(good, baseline, steady_rate(cells, trainer)),
            "recovery_parts": recovery_parts(good)}
    return out


def _median(summaries, key: str, figure: str) -> Optional[float]:
    found = summaries.get(key, {}).get(figure)
    return found["median"] if found else None


def targets(summaries: Dict[str, Dict[str, Any]], mtbfs: List[float],
            bars: Dict[float, float]) -> List[Dict[str, Any]]:
    """The issue's targets, each with its value and whether it was met (None: no figure)."""
    rows = []

    def row(what, value, op, bar):
        met = None if value is None else (value >= bar if op == ">=" else value <= bar)
        rows.append({"target": what, "value": value, "bar": f"{op} {bar:g}", "met": met})

    for mtbf in mtbfs:
        ours = _median(summaries, cell_key("raysgd", mtbf), "goodput")
        if mtbf in bars:
            row(f"raysgd goodput, MTBF {mtbf:g}s", ours, ">=", bars[mtbf])
        for peer, bar in (("raytrain", 1.5), ("torchft", 1.0), ("torchrun", None)):
            theirs = _median(summaries, cell_key(peer, mtbf), "goodput")
            ratio = ours / theirs if ours is not None and theirs else None
            what = f"raysgd/{LABELS[peer]} goodput, MTBF {mtbf:g}s"
            if bar is None:  # this machine flatters torchrun: no cluster to lose
                rows.append({"target": what, "value": ratio, "bar": "-", "met": None})
            else:
                row(what, ratio, ">=", bar)
        kinds = summaries.get(cell_key("raysgd", mtbf), {}).get("breakdown", {})
        if kinds.get("preempt"):
            row(f"raysgd steps redone after preemptions, MTBF {mtbf:g}s",
                kinds["preempt"]["redone_steps"], "<=", 0)
        if kinds.get("node") and kinds["node"]["pause_s"]:
            row(f"raysgd lost node -> next step (median pause), MTBF {mtbf:g}s",
                kinds["node"]["pause_s"]["median"], "<=", LOST_NODE_BAR_S)
    base = _median(summaries, cell_key("torchrun", None), "steady_samples_per_s")
    for trainer in ("raysgd", "raytrain", "torchft"):
        mine = _median(summaries, cell_key(trainer, None), "steady_samples_per_s")
        if mine is not None and base:
            rows.append({"target": f"unfaulted {LABELS[trainer]}/torchrun samples/s",
                         "value": mine / base, "bar": "-", "met": None})
    return rows
