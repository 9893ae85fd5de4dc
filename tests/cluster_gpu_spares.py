"""Run by test_fault_tolerance in its own process: GPU spares on a fake-GPU cluster.

Ray's own tests declare GPUs a node does not have (``num_gpus``); Ray then reserves and
assigns them (``CUDA_VISIBLE_DEVICES``, ``ray.get_gpu_ids()``) as on a real GPU node, and
the workers train on the CPU (no CUDA here). One node of 4 CPUs and 2 GPUs beside a
head without GPUs, trained on by two trainers in turn:

* ``roomy`` (1 CPU per worker, 2 CPUs left): the default spare is kept there, holding
  no GPU and seeing none; SIGKILL rank 1 and the spare takes its place with the dead
  rank's device, rank 0 stays.
* ``full`` (2 CPUs per worker, none left): no default spare; SIGKILL rank 1 and a new
  process in rank 1's bundle (with its GPU) takes its place, rank 0 stays.

Prints one JSON line with what it saw.
"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from operators_for_tests import LinearOperator  # noqa: E402
from raysgd import TorchTrainer, release_idle_workers  # noqa: E402


def view():
    """What a worker process sees of its GPUs."""
    return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpus": [str(i) for i in ray.get_gpu_ids()]}


def run(cpus_per_worker: int) -> dict:
    trainer = TorchTrainer(training_operator_cls=LinearOperator, num_workers=2, use_gpu=True,
                           backend="gloo", num_cpus_per_worker=cpus_per_worker,
                           config={"lr": 0.01})
    trainer.train()  # its end commit starts the default spare, if the node has room
    spares = trainer._supervisor.group.spares
    seen = {"gpus_free": ray.available_resources().get("GPU", 0.0), "spares": len(spares)}
    if spares:
        ray.get(spares[0].ready, timeout=120)
        seen["spare"] = ray.get(spares[0].actor.node_info.remote())
        seen["gpus_free_spare_warm"] = ray.available_resources().get("GPU", 0.0)
    before = trainer.apply_all_workers(view)
    os.kill(before[1]["pid"], signal.SIGKILL)
    time.sleep(0.5)
    seen["loss"] = trainer.train()["train_loss"]
    seen.update(before=before, after=trainer.apply_all_workers(view),
                stats=vars(trainer.recovery_stats).copy(),
                devices_after=trainer._supervisor.group._devices)
    seen["stats"].pop("resizes")
    trainer.shutdown()
    release_idle_workers()  # an idle GPU crew keeps its GPUs
    return seen


def main():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=4, num_gpus=2)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    cluster.wait_for_nodes()
    result = {"roomy": run(1), "full": run(2)}
    ray.shutdown()
    cluster.shutdown()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
