"""The tax benchmark's figures per cell, the bars and the printed tables."""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional

from tabulate import tabulate

MIB = 2**20

# (key, figure, bar, cells, test): the bars, printed with "met", never enforced.
BARS = (
    ("steady_ratio", "DDP steady ratio to the loop", ">= 0.98 at all three sizes",
     [("ddp", s) for s in ("small", "medium", "large")], lambda v: v >= 0.98),
    ("steady_ratio", "FSDP steady ratio to torchrun FSDP2", ">= 0.97 at medium and large",
     [("fsdp", s) for s in ("medium", "large")], lambda v: v >= 0.97),
    ("memory_growth_pss", "host memory that grows with the state, beyond the loop's, ÷ the "
     "state (PSS)", "<= 1.0 (every cell but each strategy's smallest)", None,
     lambda v: v <= 1.0),
    ("steps_redone", "steps redone per killed rank, DDP", "<= 1",
     [("ddp", s) for s in ("small", "medium", "large")], lambda v: v <= 1),
    ("redone_over_interval", "steps redone per killed rank ÷ the commit interval, FSDP",
     "<= 1", [("fsdp", s) for s in ("small", "medium", "large")], lambda v: v <= 1),
    ("growth_over_kills", "peak memory growth from the 1st to the 3rd of three kills in a "
     "row, ÷ the state", "<= 0.25 at medium and large",
     [(t, s) for t in ("ddp", "fsdp") for s in ("medium", "large")], lambda v: v <= 0.25),
    ("hold_over_copy", "training-thread time per commit at large ÷ one plain copy",
     "<= 0.10", [("ddp", "large"), ("fsdp", "large")], lambda v: v <= 0.10),
)


KILL_FIGURES = ("steps_redone", "redone_over_interval", "growth_over_kills")  # from the kill run


def _median(values) -> Optional[float]:
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def _ok(runs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [run for run in runs if run.get("ok")]


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _epoch_medians(runs: List[Dict[str, Any]]) -> List[float]:
    """Each epoch's median seconds over the runs (the first epoch included)."""
    return [statistics.median(column) for column in zip(*(r["epoch_s"] for r in runs))]


def hold_per_commit(run: Dict[str, Any]) -> Dict[str, Any]:
    """Seconds a commit held the training thread up, from every profiled call of a raysgd
    run (``profile``'s ``commit_hold_s`` / ``commits``): the largest over the ranks that
    took commits; None where raysgd does not report them or no call took one."""
    calls = list(run.get("epoch_commits") or []) + list((run.get("probe") or {}).get("calls")
                                                        or [])
    if not calls or any(call.get("commits") is None for call in calls):
        return {"hold_per_commit_s": None, "commits": None}
    counts = [sum(column) for column in zip(*(call["commits"] for call in calls))]
    holds = [sum(column) for column in zip(*(call["commit_hold_s"] for call in calls))]
    per_rank = [hold / count for hold, count in zip(holds, counts) if count]
    return {"hold_per_commit_s": max(per_rank) if per_rank else None, "commits": max(counts)}


def cell_summary(runs: Dict[str, list], copy: Optional[Dict[str, Any]], strategy: str,
                 ranks: int) -> Dict[str, Any]:
    """The cell's figures from its runs (medians over the good ones) and the copy probe."""
    raysgd, loop, kill = (_ok(runs[kind]) for kind in ("raysgd", "loop", "kill"))
    loop_huge = _ok(runs.get("loop_huge", []))  # not in the CI smoke
    share = ranks if strategy == "fsdp" else 1
    state = copy["state_bytes"] / share if copy else None
    copy_s = copy["copy_s"].get(str(share)) if copy else None
    holds = [hold_per_commit(run) for run in raysgd]
    hold = _median(h["hold_per_commit_s"] for h in holds)
    probe = next((run["probe"] for run in raysgd if run.get("probe")), None) or {}
    out: Dict[str, Any] = {
        "state_bytes_per_rank": state, "copy_s": copy_s,
        "raysgd_samples_per_s": _median(r["steady_samples_per_s"] for r in raysgd),
        "loop_samples_per_s": _median(r["steady_samples_per_s"] for r in loop),
        "loop_huge_samples_per_s": _median(r["steady_samples_per_s"] for r in loop_huge),
        "raysgd_epoch_s": _epoch_medians(raysgd), "loop_epoch_s": _epoch_medians(loop),
        "in_epoch_commits_per_run": _median(h["commits"] for h in holds),
        "hold_per_commit_s": hold, "hold_over_copy": _div(hold, copy_s),
        "cpu_per_commit_ranks_s": probe.get("cpu_per_commit_ranks_s"),
        "cpu_per_commit_tree_s": probe.get("cpu_per_commit_tree_s"),
        "steps_redone": kill[0]["steps_rerun"] if kill else None,
        "interval_at_kill": kill[0].get("commit_interval") if kill else None,
        "redone_over_interval": _div(kill[0]["steps_rerun"], kill[0].get("commit_interval"))
        if kill else None,
        "kill_to_next_step_s": kill[0]["recovery_s"] if kill else None,
        "growth_over_kills": kill[0].get("growth_over_state") if kill else None,
        "spares": _median(r.get("spares") for r in raysgd)}
    out["steady_ratio"] = _div(out["raysgd_samples_per_s"], out["loop_samples_per_s"])
    # raysgd's ranks allocate in huge pages by default (raysgd.worker.huge_pages); against
    # the loop doing the same, what is left is the framework's own cost.
    out["like_for_like_ratio"] = _div(out["raysgd_samples_per_s"],
                                      out["loop_huge_samples_per_s"])
    for memory, key in (("pss", "peak_pss_mib"), ("rss", "peak_mem_mib")):
        mine, theirs = _median(r[key] for r in raysgd), _median(r[key] for r in loop)
        out[f"raysgd_peak_{memory}_mib"], out[f"loop_peak_{memory}_mib"] = mine, theirs
        beyond = mine - theirs if mine is not None and theirs is not None else None
        out[f"memory_over_state_{memory}"] = _div(beyond * MIB if beyond is not None else None,
                                                  state)
    return out


def add_growth(results: Dict[str, Dict[str, Any]]) -> None:
    """Each cell's ``memory_growth_pss``: how much raysgd's peak beyond the loop's grows per
    byte of state from its strategy's smallest cell in the run ((beyond - beyond_smallest) /
    (state - state_smallest)). A fixed cost (Ray's own processes, about 360 MiB, imports)
    cancels; what is left is what commits and their copies cost. None for the smallest cell."""
    for doc in results.values():
        doc["summary"]["memory_growth_pss"] = None
    for strategy in {doc["strategy"] for doc in results.values()}:
        cells = sorted((doc["summary"] for doc in results.values()
                        if doc["strategy"] == strategy
                        and doc["summary"]["state_bytes_per_rank"] is not None),
                       key=lambda s: s["state_bytes_per_rank"])
        for summary in cells[1:]:
            base = cells[0]
            beyond = [s["raysgd_peak_pss_mib"] - s["loop_peak_pss_mib"]
                      if None not in (s["raysgd_peak_pss_mib"], s["loop_peak_pss_mib"])
                      else None for s in (summary, base)]
            if None not in beyond:
                summary["memory_growth_pss"] = (beyond[0] - beyond[1]) * MIB / (
                    summary["state_bytes_per_rank"] - base["state_bytes_per_rank"])


def bars(results: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Each bar with the values of its cells that ran (for steps redone: that had a kill run)
    and whether they meet it: False if one misses it, True if every cell of the bar has a
    value and all meet it, else None (so also when no cell of it ran)."""
    out = []
    for key, figure, bar, cells, test in BARS:
        names = [f"{s}/{z}" for s, z in cells] if cells else [
            name for name, doc in results.items() if doc["summary"].get(key) is not None]
        values = {name: results[name]["summary"].get(key) for name in names if name in results
                  and (key not in KILL_FIGURES
                       or results[name]["runs"]["kill"])}
        complete = bool(values) and len(values) == len(names) and None not in values.values()
        judged = [test(v) for v in values.values() if v is not None]
        met = False if not all(judged) else True if complete else None
        out.append({"figure": figure, "bar": bar, "key": key, "values": values, "met": met})
    return out


def _fmt(value: Optional[float], scale: float = 1.0, digits: int = 2) -> str:
    return "n/a" if value is None else f"{round(value * scale, digits) + 0.0:.{digits}f}"


def _whole(value: Optional[float]) -> bool:
    return value is not None and float(value).is_integer()


def _epochs(values: List[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values) or "n/a"


def tables(results: Dict[str, Dict[str, Any]], table: List[Dict[str, Any]]) -> str:
    speed, commits, memory = [], [], []
    for name, doc in results.items():
        s = doc["summary"]
        speed.append([name, doc["ranks"], _fmt(s["raysgd_samples_per_s"], digits=0),
                      _fmt(s["loop_samples_per_s"], digits=0), _fmt(s["steady_ratio"], digits=3),
                      _fmt(s.get("like_for_like_ratio"), digits=3),
                      _epochs(s["raysgd_epoch_s"]), _epochs(s["loop_epoch_s"])])
        commits.append([name, _fmt(s["state_bytes_per_rank"], 1e-6, 1),
                        _fmt(s["in_epoch_commits_per_run"], digits=0),
                        _fmt(s["hold_per_commit_s"], 1e3), _fmt(s["copy_s"], 1e3),
                        _fmt(s["hold_over_copy"], digits=3),
                        _fmt(s["cpu_per_commit_ranks_s"], 1e3),
                        _fmt(s["cpu_per_commit_tree_s"], 1e3)])
        memory.append([name, _fmt(s["raysgd_peak_pss_mib"], digits=0),
                       _fmt(s["loop_peak_pss_mib"], digits=0),
                       _fmt(s["memory_over_state_pss"]), _fmt(s.get("memory_growth_pss")),
                       _fmt(s["raysgd_peak_rss_mib"], digits=0),
                       _fmt(s["loop_peak_rss_mib"], digits=0), _fmt(s["memory_over_state_rss"]),
                       _fmt(s["steps_redone"], digits=0), _fmt(s.get("interval_at_kill"), digits=0),
                       _fmt(s["kill_to_next_step_s"]), _fmt(s.get("growth_over_kills"))])
    bar_rows = [[b["figure"], ", ".join(f"{name} {_fmt(v, digits=0 if _whole(v) else 3)}"
                                        for name, v in b["values"].items()) or "n/a",
                 b["bar"], {True: "yes", False: "NO", None: "n/a"}[b["met"]]] for b in table]
    return "\n\n".join([
        tabulate(speed, headers=["cell", "ranks", "raysgd samples/s", "loop samples/s",
                                 "raysgd/loop", "raysgd/loop+THP", "raysgd epochs (s)",
                                 "loop epochs (s)"]),
        tabulate(commits, headers=["cell", "state/rank (MB)", "in-epoch commits/run",
                                   "hold/commit (ms)", "plain copy (ms)", "hold ÷ copy",
                                   "CPU/commit ranks (ms)", "CPU/commit tree (ms)"]),
        tabulate(memory, headers=["cell", "peak PSS raysgd (MiB)", "peak PSS loop (MiB)",
                                  "beyond ÷ state (PSS)", "growth ÷ state (PSS)",
                                  "peak RSS raysgd (MiB)",
                                  "peak RSS loop (MiB)", "beyond ÷ state (RSS)",
                                  "steps redone", "commit interval", "kill→next step (s)",
                                  "growth over 3 kills ÷ state"]),
        tabulate(bar_rows, headers=["figure", "values", "bar", "met"])]) + "\n"


def print_report(results: Dict[str, Dict[str, Any]], table: List[Dict[str, Any]],
                 meta: Dict[str, Any], copies: Dict[str, Any]) -> None:
    print(f"\ntax benchmark ({meta['mode']}{', GPU' if meta['gpu'] else ''}), "
          f"{meta['repeats']} run(s) of raysgd and of the loop per cell; medians; "
          f"n/a: not measured or not reported\n")
    if copies["error"]:
        print("copy probe FAILED: " + copies["error"].splitlines()[-1] + "\n")
    print(tables(results, table))
