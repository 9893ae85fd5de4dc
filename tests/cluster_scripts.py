"""Multi-node scripts (``cluster_*.py``): each runs a ``ray.cluster_utils.Cluster`` in its
own process and prints one ``RESULT <json>`` line; the tests start them and read it."""
import json
import os
import subprocess
import sys

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def run_cluster_script(name: str, *args: str, timeout: float) -> dict:
    """Run ``tests/<name>`` with ``args``; its last RESULT line, parsed (fails with the
    output's tail when there is none)."""
    out = subprocess.run([sys.executable, os.path.join(TESTS_DIR, name), *args],
                         capture_output=True, text=True, timeout=timeout)
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
