"""SIGKILL the driver mid-epoch, run the same script again, and read what the resume cost.

The driver (``bench.disk.driver``) logs every completed step with its wall
time and pid (``bench/recovery/steplog.py``). The kill lands three quarters
into epoch 2, like the recovery benchmark's. From the log:

- fresh launch → first step: the first run's start-up, for comparison;
- resumed launch → first step: from starting the script again to its first
  completed step (the checkpoint read and restored on the way);
- steps re-run: the newest step reached before the kill minus the step the
  second run resumed from (at most one disk interval plus the step in flight).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List

from bench.launch import REPO_ROOT
from bench.recovery.steplog import analyse, read_log, read_setups
from bench.workloads import get_workload

QUICK_STEP_SLEEP_S = 0.05  # quick-mode steps take milliseconds: pace them like real ones


def _launch(run_dir: str, step_dir: str, mode: str, commit_every: int) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO_ROOT, env.get("PYTHONPATH")) if p)
    return subprocess.Popen(
        [sys.executable, "-m", "bench.disk.driver", "--dir", run_dir, "--step-dir", step_dir,
         "--mode", mode, "--commit-every", str(commit_every),
         "--step-sleep", str(QUICK_STEP_SLEEP_S if mode == "quick" else 0.0)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True)


def _kill_group(proc: subprocess.Popen) -> None:
    """The killed driver's Ray agents can outlive it; they hold nothing of the run."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_for_step(step_dir: str, step: int, proc: subprocess.Popen, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = read_log(step_dir)
        if records and records[-1][0] >= step:
            return records[-1][0]
        if proc.poll() is not None:
            raise RuntimeError(f"the driver exited early: {proc.stderr.read()[-2000:]}")
        time.sleep(0.002)
    raise RuntimeError(f"step {step} not reached within {timeout_s:.0f}s")


def once(tmp: str, mode: str, commit_every: int, timeout_s: float = 300.0) -> Dict[str, Any]:
    workload = get_workload("mlp", mode)
    per_epoch = workload.num_samples // workload.batch_size
    kill_step = per_epoch + 3 * per_epoch // 4
    run_dir, step_dir = os.path.join(tmp, "run"), os.path.join(tmp, "steps")
    os.makedirs(step_dir)
    launched = time.time()
    first = _launch(run_dir, step_dir, mode, commit_every)
    try:
        step_at_kill = _wait_for_step(step_dir, kill_step, first, timeout_s)
        kill_time = time.time()
        os.kill(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        _kill_group(first)
    fresh_first = read_log(step_dir)[0][1] - launched
    relaunched = time.time()
    second = _launch(run_dir, step_dir, mode, commit_every)
    try:
        _, err = second.communicate(timeout=timeout_s)
    finally:
        _kill_group(second)
    if second.returncode != 0:
        raise RuntimeError(f"the resumed driver failed: {err[-2000:]}")
    records = read_log(step_dir)
    found = analyse(records, kill_time, read_setups(step_dir))
    # The killed driver's workers can finish a step or two before Ray reaps them:
    # the resumed run's steps are the ones from another rank-0 process.
    old_pid = [r for r in records if r[1] <= kill_time][-1][2]
    resumed = [r for r in records if r[1] > kill_time and r[2] != old_pid]
    return {"fresh_first_step_s": fresh_first,
            "resumed_first_step_s": resumed[0][1] - relaunched if resumed else None,
            "steps_rerun": found["steps_rerun"], "resumed_from_step": found["resumed_from_step"],
            "step_at_kill": step_at_kill, "disk_interval": commit_every,
            "final_step": records[-1][0], "expected_final_step": per_epoch * workload.epochs}


def measure(tmp: str, mode: str, commit_every: int, repeats: int) -> List[Dict[str, Any]]:
    runs = []
    for index in range(repeats):
        directory = os.path.join(tmp, f"resume-{index}")
        os.makedirs(directory)
        runs.append(once(directory, mode, commit_every))
    return runs
