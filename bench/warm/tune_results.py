"""What both Tune variants share: the trials' search space and the figures of a finished run.

Each trial reports ``bench_worker_pids`` (its workers' pids, comma-separated)
and ``bench_trainable_pid`` (the process running the trial's driver). Tune
fills in ``pid`` and ``hostname`` itself, so the benchmark's keys carry a prefix.
"""
from __future__ import annotations

import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List


def learning_rates(trials: int) -> List[float]:
    """``trials`` distinct learning rates (a grid search runs each once)."""
    return [round(0.01 * (index + 1), 4) for index in range(trials)]


def timed_fit(make_tuner: Callable[[str], Any], prefix: str, trials: int) -> Dict[str, Any]:
    """Start Ray, build the tuner with a temporary storage path, time its ``fit()``, stop
    Ray, remove the storage; the run's figures."""
    import ray

    storage = tempfile.mkdtemp(prefix=prefix)
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        tuner = make_tuner(storage)
        begin = time.perf_counter()
        results = tuner.fit()
        total_s = time.perf_counter() - begin
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    return tune_figures(results, trials, total_s)


def tune_figures(results, trials: int, total_s: float) -> Dict[str, Any]:
    """The run's figures from Tune's ``ResultGrid`` and the time ``fit()`` took."""
    metrics = [result.metrics or {} for result in results]
    errors = [repr(result.error) for result in results if result.error is not None]
    done = [m for m in metrics if m.get("bench_worker_pids")]
    worker_pids = {pid for m in done for pid in str(m["bench_worker_pids"]).split(",")}
    trainable_pids = {m.get("bench_trainable_pid") for m in done}
    return {"total_s": total_s, "per_trial_s": total_s / trials, "trials": trials,
            "trials_done": len(done),
            "distinct_worker_pids": len(worker_pids) if done else None,
            "distinct_trainable_pids": len(trainable_pids) if done else None,
            "trial_errors": errors[:3]}
