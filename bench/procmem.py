"""Peak resident memory of a process and all its descendants, sampled in a thread.

Uses psutil when it is installed, else reads ``/proc`` directly. Either way the
figure is the largest observed *sum of RSS* over the tree (pages shared between
processes count once per process), sampled every ``interval_s``.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, Iterable, List

try:
    import psutil
except ImportError:  # pragma: no cover - psutil ships with Ray, but stay usable without
    psutil = None

METHOD = ("psutil" if psutil else "/proc") + ": max over samples of the summed RSS of the tree"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _tree_rss_psutil(pid: int) -> int:
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return total


def _parents() -> Dict[int, int]:
    """pid → parent pid for every process in ``/proc``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    # the command name may hold spaces; fields after ')' are fixed
                    parents[int(entry)] = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return parents


def _descendants(pid: int, parents: Dict[int, int]) -> List[int]:
    children: Dict[int, List[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def _rss_proc(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as statm:
                total += int(statm.read().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            pass
    return total


def tree_rss(pid: int) -> int:
    """Summed RSS in bytes of ``pid`` and its descendants right now."""
    if psutil:
        return _tree_rss_psutil(pid)
    return _rss_proc(_descendants(pid, _parents()))


class PeakMemory:
    """``with PeakMemory(pid) as peak: ...``; then ``peak.mib``."""

    def __init__(self, pid: int, interval_s: float = 0.2):
        self.pid = pid
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_rss(self.pid))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mib(self) -> float:
        return self.peak_bytes / 2**20


def descendants(pid: int) -> List[int]:
    """Every process under ``pid`` (from ``/proc``), not ``pid`` itself."""
    return [found for found in _descendants(pid, _parents()) if found != pid]


def start_ticks(pid: int):
    """When ``pid`` started (clock ticks since boot, ``/proc/PID/stat`` field 22): tells a
    process from a later one that reused its pid. None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def cpu_seconds(pids) -> float:
    """User + system CPU time of these processes (all their threads) so far, from ``/proc``."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")
