"""Run a function in a thread at the lowest CPU priority; no Ray here.

A warm spare imports torch, ``torch._dynamo`` and the operator's module (several
CPU-seconds) while the group it waits beside is training. At normal priority that
import competes with the training processes for the same cores; in the idle
scheduling class it only gets CPU time the trainers leave unused, and once a
rank dies its core is free, so the spare finishes warming when it is needed.

Only the calling thread's priority changes (Linux schedules threads, and both
``sched_setscheduler(0, ...)`` and ``setpriority`` on a thread id act on that
thread alone). An unprivileged process cannot raise a priority it lowered, so the
work runs in a thread of its own that ends with it: the process's other threads,
and every thread started later (the training thread, OpenMP's pool, gloo's), keep
normal priority. A thread that a library starts *while* being imported would inherit
the idle class (OpenBLAS starts its pool when numpy loads), so callers import such
libraries first, at normal priority; any that slipped through are put back where the
process may (root, ``CAP_SYS_NICE``) and named in a warning where it may not.
"""
from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Callable, Dict, Iterable, List, Tuple

logger = logging.getLogger("raysgd")

NORMAL = "normal"


def lower_this_thread() -> str:
    """Put the calling thread in the idle class (else nice 19); returns what it got."""
    if not sys.platform.startswith("linux"):
        return NORMAL  # elsewhere priorities are per process and could not come back
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        return "idle"
    except (AttributeError, OSError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        return "nice 19"
    except OSError:
        return NORMAL


def thread_priority(native_id: int) -> Tuple[int, int]:
    """``(scheduling policy, nice value)`` of one thread of this process (Linux)."""
    return os.sched_getscheduler(native_id), os.getpriority(os.PRIO_PROCESS, native_id)


def threads_left_low(exclude: Iterable[int] = ()) -> List[int]:
    """Thread ids of this process, but ``exclude``, in the idle class or niced beyond the
    process's main thread (Linux; empty elsewhere). Ray starts its workers niced already
    (15 by default). A joined thread can still be listed for a moment while it exits."""
    if not sys.platform.startswith("linux"):
        return []
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    skip = set(exclude)
    low = []
    for name in os.listdir("/proc/self/task"):
        try:
            policy, nice = thread_priority(int(name))
        except OSError:
            continue  # it ended meanwhile
        idle = policy == getattr(os, "SCHED_IDLE", -1)
        if int(name) not in skip and (idle or nice > base):
            low.append(int(name))
    return low


def raise_back(threads: Iterable[int]) -> List[int]:
    """Put ``threads`` back to the normal class at the main thread's nice value; returns
    those this process may not raise (no ``CAP_SYS_NICE``)."""
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    stuck = []
    for tid in threads:
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, base)
        except ProcessLookupError:
            continue  # it ended meanwhile
        except OSError:
            stuck.append(tid)
    return stuck


def _thread_names(tids: Iterable[int]) -> List[str]:
    names = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as handle:
                names.append(f"{handle.read().strip()} ({tid})")
        except OSError:
            names.append(str(tid))
    return names


def run_in_background(fn: Callable[[], Any]) -> Tuple[Any, Dict[str, Any]]:
    """``fn()`` in a new thread at the lowest priority; its result and what the thread ran
    at (``priority``, its ``thread`` id and, on Linux, its ``policy`` and ``nice``), plus
    ``threads_left_low``: threads ``fn`` started that are still low (see the module's doc).
    ``fn``'s exception is raised here."""
    outcome: Dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["thread"] = threading.get_native_id()
            outcome["priority"] = lower_this_thread()
            if sys.platform.startswith("linux"):
                outcome["policy"], outcome["nice"] = thread_priority(outcome["thread"])
            outcome["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=body, name="raysgd-warm-up", daemon=True)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    info = {key: outcome[key] for key in ("priority", "thread", "policy", "nice") if key in outcome}
    info["threads_left_low"] = raise_back(threads_left_low(exclude=[outcome["thread"]]))
    if info["threads_left_low"]:
        logger.warning("raysgd: thread(s) %s started during a low-priority warm-up keep its "
                       "priority (this process may not raise it); import the library that "
                       "starts them before the warm-up", _thread_names(info["threads_left_low"]))
    return outcome.get("result"), info
