"""Summaries (median/min/max), the tracked ratios, the printed tables and the JSON file."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from typing import Any, Dict, List, Optional

from tabulate import tabulate

from bench.catalog import BY_NAME
from bench.launch import FIGURES, REPO_ROOT
from bench.procmem import METHOD as MEMORY_METHOD

HEADERS = {"first_step_s": "first step (s)", "steady_samples_per_s": "steady samples/s",
           "wall_s": "wall (s)", "peak_mem_mib": "peak mem (MiB)"}

# (label, numerator, denominator, figure, target): ratios are numerator/denominator
# of medians; the targets are reported, never enforced.
RATIOS = (
    ("raysgd/torchrun", "raysgd_2w", "torchrun_2w", "first_step_s", ("<=", 1.5)),
    ("raysgd/torchrun", "raysgd_2w", "torchrun_2w", "steady_samples_per_s", (">=", 0.98)),
    ("raysgd/Ray Train", "raysgd_2w", "raytrain_2w", "first_step_s", ("<=", 0.40)),
    ("raysgd/Ray Train", "raysgd_2w", "raytrain_2w", "steady_samples_per_s", None),
    # The default's warm spare must not slow training (issue 22).
    ("raysgd default/no spare", "raysgd_2w", "raysgd_2w_nospare", "steady_samples_per_s",
     (">=", 0.98)),
    ("raysgd(1 worker)/plain", "raysgd_1w", "plain_1t", "first_step_s", None),
    ("raysgd(1 worker)/plain", "raysgd_1w", "plain_1t", "steady_samples_per_s", (">=", 0.98)),
    ("raysgd plain-init/lean", "raysgd_2w_plain_init", "raysgd_2w", "first_step_s", None),
    ("raysgd plain-init/lean", "raysgd_2w_plain_init", "raysgd_2w", "steady_samples_per_s", None),
)


def summarize(runs: List[Dict[str, Any]],
              figures=FIGURES) -> Dict[str, Optional[Dict[str, float]]]:
    """Per figure: median, min, max and n over the successful runs (None if none)."""
    good = [run for run in runs if run["ok"]]
    out = {}
    for figure in figures:
        values = [run[figure] for run in good]
        out[figure] = (None if not values else
                       {"median": statistics.median(values), "min": min(values),
                        "max": max(values), "n": len(values)})
    return out


def compute_ratios(summaries: Dict[str, Dict[str, Any]], ratios=RATIOS) -> List[Dict[str, Any]]:
    """The tracked ratios whose two variants both have figures.

    ``figure`` in a ratio spec may also be a pair ``(numerator figure, denominator
    figure)``; the result's ``figure`` is then ``"num_figure/den_figure"``.
    """
    out = []
    for label, num, den, figure, target in ratios:
        num_figure, den_figure = figure if isinstance(figure, tuple) else (figure, figure)
        figure = figure if isinstance(figure, str) else f"{num_figure}/{den_figure}"
        a = summaries.get(num, {}).get(num_figure)
        b = summaries.get(den, {}).get(den_figure)
        if not a or not b or not b["median"]:
            continue
        value = a["median"] / b["median"]
        met = None if target is None else (value <= target[1] if target[0] == "<=" else
                                           value >= target[1])
        out.append({"ratio": label, "figure": figure, "numerator": num, "denominator": den,
                    "value": value, "target": None if target is None else f"{target[0]} {target[1]}",
                    "met": met})
    return out


def cell(stats: Optional[Dict[str, float]]) -> str:
    """One summary as ``median [min – max]`` ("failed" when there is none)."""
    return _cell(stats)


def _cell(stats: Optional[Dict[str, float]]) -> str:
    if not stats:
        return "failed"
    fmt = "{:.0f}" if stats["median"] >= 100 else "{:.2f}"
    return (fmt + " [" + fmt + " – " + fmt + "]").format(stats["median"], stats["min"], stats["max"])


def tables(summaries: Dict[str, Dict[str, Any]], ratios: List[Dict[str, Any]]) -> str:
    """The figures table (median [min – max]) and the ratios table, as text."""
    rows = [[name, BY_NAME[name].label, *(_cell(s[f]) for f in FIGURES),
             max((s[f] or {}).get("n", 0) for f in FIGURES)]
            for name, s in summaries.items()]
    figures = tabulate(rows, headers=["variant", "what", *(HEADERS[f] for f in FIGURES), "n"])
    return f"{figures}\n\n{ratio_table(ratios, HEADERS)}\n"


def epoch_table(runs: Dict[str, List[Dict[str, Any]]], first: int) -> str:
    """Median seconds of each epoch (numbered from ``first``) per variant that times its
    epochs: a slow second epoch shows here, where a steady average would hide it."""
    rows = []
    for name, variant_runs in runs.items():
        timed = [run["epoch_s"] for run in variant_runs if run.get("ok") and run.get("epoch_s")]
        if timed:
            columns = zip(*timed)  # epoch by epoch, over the runs that timed them all
            rows.append([name, *(f"{statistics.median(column):.2f}" for column in columns)])
    if not rows:
        return ""
    width = max(len(row) for row in rows) - 1
    return tabulate(rows, headers=["epoch (s, median)", *(str(first + i) for i in range(width))])


def ratio_table(ratios: List[Dict[str, Any]], headers: Dict[str, str]) -> str:
    """The ratios (medians) with their targets and whether each was met, as text."""
    rows = [[r["ratio"], headers[r["figure"]], f"{r['value']:.3f}", r["target"] or "-",
             {True: "yes", False: "NO", None: "-"}[r["met"]]] for r in ratios]
    return tabulate(rows, headers=["ratio (medians)", "figure", "value", "target", "met"])


def _version(package: str) -> Optional[str]:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _git_commit() -> Optional[str]:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def metadata_block(args: Dict[str, Any]) -> Dict[str, Any]:
    """Where and how the figures were taken."""
    return {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "torch": _version("torch"), "ray": _version("ray"), "git_commit": _git_commit(),
            "memory_method": MEMORY_METHOD, **args}


def write_json(path: str, document: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as out:
        json.dump(document, out, indent=2)
    os.replace(tmp, path)


def exit_and_figure_problems(run: Dict[str, Any], figures) -> List[str]:
    """What is wrong with a run before any mode's own checks: its exit code, missing figures."""
    problems = []
    if run.get("exit_code") != 0:
        problems.append(f"exit {run.get('exit_code')}")
    missing = [figure for figure in figures if run.get(figure) is None]
    if missing:
        problems.append(f"missing figures {missing}")
    return problems


def settle(run: Dict[str, Any], problems: List[str]) -> Dict[str, Any]:
    """Set ``run["ok"]`` and ``run["error"]`` from a mode's ``problems`` and the launcher's text."""
    tail = run.pop("error", "")
    if tail.startswith("timed out"):
        problems.insert(0, tail.split(";", 1)[0])
    run["ok"] = not problems
    if problems:
        detail = tail.split("\n", 1)[1] if "\n" in tail else ""
        run["error"] = "; ".join(problems) + ("; output tail:\n" + detail if detail else "")
    return run


def save(out: str, meta: Dict[str, Any], variants_doc: Dict[str, Any], ratios: list,
         runs: Dict[str, list]) -> int:
    """Write the JSON, say where, name failed variants; the exit code (1 if any failed)."""
    write_json(out, {"meta": meta, "variants": variants_doc, "ratios": ratios})
    print(f"written to {out}")
    failed = [name for name, variant_runs in runs.items() if not all(r["ok"] for r in variant_runs)]
    if failed:
        print(f"failed runs in: {', '.join(failed)} (see 'error' in the JSON)", file=sys.stderr)
    return 1 if failed else 0
