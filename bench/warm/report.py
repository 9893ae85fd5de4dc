"""The warm-worker benchmark's text: one table per kind of run, the targets, the ratios."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from tabulate import tabulate

from bench.report import cell, ratio_table
from bench.warm.catalog import HEADERS, TARGETS, Entry

COLUMNS = {
    "second": ("first_trainer_s", "second_trainer_s", "same_pids", "reused_workers",
               "shutdown_s", "launch_first_step_s", "wall_s", "peak_mem_mib"),
    "tune": ("total_s", "per_trial_s", "trials_done", "distinct_worker_pids",
             "distinct_trainable_pids", "wall_s", "peak_mem_mib"),
    "recovery": ("recovery_s", "recovery_reported_s", "steps_rerun", "steps_lost_reported",
                 "first_step_s", "wall_s", "peak_mem_mib"),
}
YES_NO = ("same_pids",)


def judge_targets(summaries: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The issue's absolute targets whose variant ran: the median against the bound."""
    out = []
    for label, name, figure, short, (op, bound) in TARGETS:
        if name not in summaries:
            continue
        stats = summaries[name].get(figure)
        value = stats["median"] if stats else None
        met = None if value is None else (value <= bound if op == "<=" else value >= bound)
        out.append({"target": label, "variant": name, "figure": figure, "short": short,
                    "value": value, "bound": f"{op} {bound}", "met": met})
    return out


def _cell(figure: str, stats: Optional[Dict[str, float]]) -> str:
    if stats and figure in YES_NO:  # 0/1 per run
        return {1: "yes", 0: "no"}.get(stats["min"] if stats["min"] == stats["max"] else None,
                                       f"mixed ({stats['median']:.1f})")
    if stats and all(float(stats[k]).is_integer() for k in ("median", "min", "max")):
        return "{:.0f} [{:.0f} – {:.0f}]".format(stats["median"], stats["min"], stats["max"])
    return cell(stats)


def _met(value: Optional[bool]) -> str:
    return {True: "yes", False: "NO", None: "-"}[value]


def _row_targets(name: str, targets: List[Dict[str, Any]]) -> str:
    return "; ".join(f"{t['short']} {t['bound']} s: {_met(t['met'])}"
                     for t in targets if t["variant"] == name) or "-"


def tables(entries: List[Entry], summaries: Dict[str, Dict[str, Any]],
           targets: List[Dict[str, Any]], ratios: List[Dict[str, Any]]) -> str:
    """Each kind's table (median [min – max]), then the targets and the ratios, as text."""
    out = []
    for kind, columns in COLUMNS.items():
        chosen = [entry for entry in entries if entry.kind == kind]
        if not chosen:
            continue
        rows = [[entry.name, entry.variant.label,
                 *(_cell(c, summaries[entry.name][c]) if c in entry.figures else "-"
                   for c in columns),
                 _row_targets(entry.name, targets),
                 max((summaries[entry.name][f] or {}).get("n", 0) for f in entry.figures)]
                for entry in chosen]
        out.append(tabulate(rows, headers=["variant", "what", *(HEADERS[c] for c in columns),
                                           "target", "n"]))
    if targets:
        out.append(tabulate(
            [[t["target"], t["variant"], HEADERS[t["figure"]],
              "failed" if t["value"] is None else f"{t['value']:.2f}", f"{t['bound']} s",
              _met(t["met"])] for t in targets],
            headers=["target (median)", "variant", "figure", "value", "target", "met"]))
    if ratios:
        out.append(ratio_table(ratios, {**HEADERS, "second_trainer_s/first_trainer_s":
                                        "trainer #2 / trainer #1 ctor→first step"}))
    return "\n\n".join(out) + "\n"
