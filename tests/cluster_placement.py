"""Run by test_legacy_semantics in its own process: three raylets of 2 CPUs each.

Starts 2 workers with each placement strategy and reports how many nodes they
landed on, and whether shutdown() gave every CPU back before it returned.
Prints one JSON line with what it saw.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from operators_for_tests import LinearOperator  # noqa: E402
from raysgd import TorchTrainer  # noqa: E402


def nodes_of(trainer):
    return len(set(trainer.apply_all_workers(lambda: ray.get_runtime_context().get_node_id())))


def main():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    cluster.wait_for_nodes()
    seen = {}
    for strategy in ("PACK", "SPREAD", "STRICT_SPREAD"):
        trainer = TorchTrainer(training_operator_cls=LinearOperator, num_workers=2, use_gpu=False,
                               placement_strategy=strategy)
        seen[strategy] = {"nodes": nodes_of(trainer), "loss": trainer.train()["train_loss"]}
        trainer.shutdown()
        seen[strategy]["cpus_after_shutdown"] = ray.available_resources().get("CPU", 0)
    print("RESULT " + json.dumps(seen), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
