"""Peak resident memory of a process and all its descendants, sampled in a thread.

Uses psutil when it is installed, else reads ``/proc`` directly. Either way the
figure is the largest observed *sum of RSS* over the tree (pages shared between
processes count once per process), sampled every ``interval_s``.

``PeakMemory(pid, pss=True)`` also samples the tree's summed *PSS* (proportional set size,
``Pss:`` of ``/proc/PID/smaps_rollup``): a page shared by n processes counts 1/n in each,
so shared pages (libraries, Ray's object store in ``/dev/shm``) count once over the tree.
The kernel walks every mapped page to answer (about 15 ms per GiB resident), so PSS is read
less often than RSS: a read starts no sooner than its predecessor's cost / ``PSS_DUTY`` after
it (at most 5 % of one core).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Dict, Iterable, List

try:
    import psutil
except ImportError:  # pragma: no cover - psutil ships with Ray, but stay usable without
    psutil = None

METHOD = ("psutil" if psutil else "/proc") + ": max over samples of the summed RSS of the tree"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PSS_DUTY = 0.05  # the most of one core PeakMemory's PSS reads may take


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


def _pss_proc(pids: Iterable[int]) -> int:
    """Summed PSS in bytes of ``pids`` (a process that is gone, or unreadable, counts 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as rollup:
                for line in rollup:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except (OSError, IndexError, ValueError):
            pass
    return total


def tree_pss(pid: int) -> int:
    """Summed PSS in bytes of ``pid`` and its descendants right now (from ``/proc``)."""
    return _pss_proc(_descendants(pid, _parents()))


def tree_rss(pid: int) -> int:
    """Summed RSS in bytes of ``pid`` and its descendants right now."""
    if psutil:
        return _tree_rss_psutil(pid)
    return _rss_proc(_descendants(pid, _parents()))


class PeakMemory:
    """``with PeakMemory(pid) as peak: ...``; then ``peak.mib`` (and, with ``pss=True``,
    ``peak.pss_mib``: the peak of the tree's summed PSS, read at some of the RSS samples)."""

    def __init__(self, pid: int, interval_s: float = 0.2, pss: bool = False):
        self.pid = pid
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.pss = pss
        self.peak_pss_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        next_pss = 0.0
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, tree_rss(self.pid))
            if self.pss and time.monotonic() >= next_pss:
                started = time.monotonic()
                self.peak_pss_bytes = max(self.peak_pss_bytes, tree_pss(self.pid))
                next_pss = started + (time.monotonic() - started) / PSS_DUTY
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

    @property
    def pss_mib(self) -> float:
        return self.peak_pss_bytes / 2**20


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


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pids) -> float:
    """User + system CPU time of these processes (all their threads) so far, from ``/proc``."""
    return sum(_cpu_ticks(pid) for pid in pids) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> Dict[int, float]:
    """pid → user + system CPU seconds so far, for ``pid`` and each of its descendants (a
    process gone while it was read is left out). Subtract two readings pid by pid: a process
    started in between counts all its CPU, one that ended in between is lost."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for found in _descendants(pid, _parents()):
        try:
            out[found] = _cpu_ticks(found) / ticks
        except (OSError, IndexError, ValueError):
            pass
    return out
