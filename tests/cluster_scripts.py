"""Multi-node scripts (``cluster_*.py``): each runs a ``ray.cluster_utils.Cluster`` in its
own process and prints one ``RESULT <json>`` line.

They run as jobs of the session's background batch (``conftest``, ``background.Batch``),
started with the session beside the other tests, after the first benchmark quick run; a
test waits for its script's job (``cluster_result``) and checks what it printed. Each gets a
directory of its own (its argument where the script takes one) and a Ray temporary
directory of its own (``RAY_TMPDIR``), so no other Ray joins its cluster.
"""
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, Iterable

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))

# script: (the test module that checks it, whether it takes a directory, its time limit).
# Longest first: the lane runs them in this order.
CLUSTER_RUNS = {
    "cluster_preemption.py": ("test_fault_tolerance", True, 300),
    "cluster_fsdp.py": ("test_fsdp", True, 360),
    "cluster_node_loss.py": ("test_fault_tolerance", True, 300),
    "cluster_gpu_spares.py": ("test_fault_tolerance", False, 300),
    "cluster_placement.py": ("test_legacy_semantics", False, 200),
}
# What a test may wait for its script: it may be queued behind the others.
WAIT_S = 900


def _run(name: str, batch) -> subprocess.CompletedProcess:
    _, takes_dir, timeout = CLUSTER_RUNS[name]
    work = tempfile.mkdtemp(prefix="raysgd-cluster-")
    os.makedirs(os.path.join(work, "ref"))  # cluster_preemption's reference run writes there
    # Short: Ray's socket paths under it must stay within the OS's limit (107 bytes).
    ray_tmp = tempfile.mkdtemp(prefix="rcs-", dir="/tmp")
    command = [sys.executable, os.path.join(TESTS_DIR, name), *([work] if takes_dir else [])]
    try:
        return batch.run(command, timeout=timeout,
                         env={**(batch.env or os.environ), "RAY_TMPDIR": ray_tmp})
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(exc.cmd, None, exc.stdout or "",
                                           (exc.stderr or "") + f"\nkilled after {exc.timeout} s")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def cluster_jobs(test_modules: Iterable[str]) -> Dict[str, Callable[[Any], Any]]:
    """The background jobs of the scripts that ``test_modules`` check."""
    selected = set(test_modules)
    return {name: functools.partial(_run, name)
            for name, (module, _, _) in CLUSTER_RUNS.items() if module in selected}


def cluster_result(jobs, name: str) -> dict:
    """Script ``name``'s last RESULT line, parsed, once its job (in the session's batch
    ``jobs``) ended; fails with the output's tail when there is none."""
    out = jobs.result(name, WAIT_S, widen=False)  # widened, a second run would join it
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def finish(trainer, cluster, result: dict) -> None:
    """The scripts' end: stop the trainer, Ray and the cluster, then print the result."""
    import ray

    trainer.shutdown()
    ray.shutdown()
    cluster.shutdown()
    print("RESULT " + json.dumps(result), flush=True)
