"""The chaos benchmark's printed report: goodput by rate, each cell, the breakdown, targets."""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from tabulate import tabulate

from bench.chaos.summary import LABELS, RECOVERY_PARTS, SHORTFALL_PARTS


def _fmt(stats: Optional[Dict[str, float]], digits: int = 2) -> str:
    if not stats:
        return "-"
    return "{0:.{3}f} [{1:.{3}f} – {2:.{3}f}]".format(stats["median"], stats["min"],
                                                      stats["max"], digits)


def _split(key: str):
    trainer, rate = key.split("@")
    return trainer, rate


def goodput_table(summaries: Dict[str, Dict[str, Any]]) -> str:
    rates = list(dict.fromkeys(_split(key)[1] for key in summaries))
    trainers = list(dict.fromkeys(_split(key)[0] for key in summaries))
    rows = [[LABELS[t], *(_fmt(summaries.get(f"{t}@{r}", {}).get("goodput")) for r in rates)]
            for t in trainers]
    return tabulate(rows, headers=["goodput", *(f"MTBF {r}" for r in rates)])


def cell_table(summaries: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for key, cell in summaries.items():
        pause = cell["pause_s"]
        rows.append([key, _fmt(cell["goodput"]), _fmt(cell["samples"], 0),
                     _fmt(cell["redone_samples"], 0), _fmt(cell["steady_samples_per_s"], 0),
                     _fmt(cell["first_step_s"], 1),
                     f"{pause['median']:.2f} / {pause['max']:.2f}" if pause else "-",
                     f"{cell['events_landed']} / {cell['events_missed']}",
                     f"{cell['ok_runs']}/{cell['runs']}", cell["trainer_errors"]])
    return tabulate(rows, headers=["cell", "goodput", "samples", "redone samples",
                                   "steady samples/s", "first step (s)",
                                   "pause med / max (s)", "events landed / missed",
                                   "ok runs", "trainer errors"])


def breakdown_table(summaries: Dict[str, Dict[str, Any]]) -> str:
    rows = []
    for key, cell in summaries.items():
        for kind, part in cell["breakdown"].items():
            rows.append([key, kind, part["events"], _fmt(part["pause_s"]),
                         part["redone_steps"], f"{part['lost_s_per_event']:.2f}",
                         f"{part['lost_s_total']:.1f}"])
    if not rows:
        return ""
    return tabulate(rows, headers=["cell", "event", "n", "pause (s)", "steps redone",
                                   "lost s/event", "lost s total"])


def shortfall_table(summaries: Dict[str, Dict[str, Any]]) -> str:
    """Where each faulted cell's goodput went (``summary.shortfall``), medians."""
    rows = [[key, *(f"{cell['shortfall'][part]['median']:.3f}" for part in SHORTFALL_PARTS)]
            for key, cell in summaries.items() if cell.get("shortfall")]
    if not rows:
        return ""
    return tabulate(rows, headers=["1 - goodput, split", *SHORTFALL_PARTS])


def recovery_parts_table(summaries: Dict[str, Dict[str, Any]]) -> str:
    """Where raysgd's recoveries spent their seconds (``recovery_stats.recovery_phases``)."""
    rows = [[key, cell["recovery_parts"]["recoveries"],
             *(_fmt(cell["recovery_parts"][part]) for part in RECOVERY_PARTS)]
            for key, cell in summaries.items() if cell.get("recovery_parts")]
    if not rows:
        return ""
    return tabulate(rows, headers=["recovery parts (s)", "n",
                                   *(part[:-2] for part in RECOVERY_PARTS)])


def target_table(rows: List[Dict[str, Any]]) -> str:
    return tabulate([[r["target"], "-" if r["value"] is None else f"{r['value']:.3f}", r["bar"],
                      {True: "yes", False: "NO", None: "-"}[r["met"]]] for r in rows],
                    headers=["target (medians)", "value", "bar", "met"])


def print_report(summaries: Dict[str, Dict[str, Any]], rows: List[Dict[str, Any]],
                 meta: Dict[str, Any]) -> None:
    print(f"\ngoodput under chaos: {meta['num_workers']} workers, MLP, {meta['repeats']} "
          f"repetition(s), window {meta['window_s']:g}s, notice {meta['notice_s']:g}s, the "
          f"peers checkpoint every {meta['peer_checkpoint_every_steps']} steps; "
          f"{meta['cpus']} cores shared by every simulated node\n")
    for part in (goodput_table(summaries), cell_table(summaries), breakdown_table(summaries),
                 shortfall_table(summaries), recovery_parts_table(summaries),
                 target_table(rows)):
        if part:
            print(part + "\n")
    print("lost s = the longest pause after an event plus its redone steps at the trainer's "
          "unfaulted step time.\n1 - goodput, split: rate = the trainer's unfaulted steady "
          "rate below torchrun's; start = before its first step; events = pauses and redone "
          "steps; rest = the remainder (slow stretches after recoveries, drift).\n")
