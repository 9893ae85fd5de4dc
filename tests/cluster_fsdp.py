"""Run by test_fsdp in its own process: FSDP on two worker nodes and a driver-only head.

Checks where the sharded commits' copies live (each rank's on the other worker node, none on
the driver's node), removes a worker node mid-epoch (the survivor reshards the commit to one
worker, reading the lost rank's shards from their copy) and adds one back (resharded to
two). Prints one JSON line with what it saw.
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from cluster_scripts import finish  # noqa: E402
from fsdp_operators import StackOperator  # noqa: E402
from raysgd import FSDP, TorchTrainer  # noqa: E402
from raysgd.recovery import FailureConfig  # noqa: E402
from raysgd.utils import BATCH_SIZE  # noqa: E402


def locations(commit, timeout_s=20):
    """Node ids holding each snapshot, once every one has two copies (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = ray.experimental.get_object_locations(commit.snapshots)
        nodes = [sorted(found[ref]["node_ids"]) for ref in commit.snapshots]
        if all(len(n) >= 2 for n in nodes) or time.monotonic() > deadline:
            return nodes
        time.sleep(0.1)


def main(pid_dir):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=1)
    second = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    driver_node = ray.get_runtime_context().get_node_id()
    trainer = TorchTrainer(
        StackOperator, num_workers=2, use_gpu=False, strategy=FSDP(), spare_workers=0,
        checkpoint_every_n_steps=4, failure_config=FailureConfig(scale_up_cooldown_s=0),
        # 256 KB per rank and commit: above Ray's inline limit, so the shards are objects
        # in the nodes' stores (smaller ones live in the driver's memory and need no copy).
        config={BATCH_SIZE: 32, "width": 128, "data_size": 512, "pid_dir": pid_dir,
                "sleep_s": 0.05})
    out = {"first": trainer.train()["num_samples"]}
    ranks = trainer.apply_all_workers(lambda: ray.get_runtime_context().get_node_id())
    copies = locations(trainer._supervisor.commit)
    out["copies"] = {"distinct_rank_nodes": len(set(ranks)) == 2,
                     "each_on_both_worker_nodes": all(n == sorted(ranks) for n in copies),
                     "none_on_driver_node": all(driver_node not in n for n in copies)}
    out["seen"] = {"ranks": ranks, "copies": copies, "driver": driver_node}

    def remove_mid_epoch():
        time.sleep(0.4)
        cluster.remove_node(second)

    threading.Thread(target=remove_mid_epoch, daemon=True).start()
    result = trainer.train()
    out["after_loss"] = {"epoch": result["epoch"], "workers": trainer.recovery_stats.num_workers,
                         "resizes": trainer.recovery_stats.resizes,
                         "finite": bool(result["train_loss"] == result["train_loss"])}
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    result = trainer.train()
    out["after_add"] = {"epoch": result["epoch"], "workers": trainer.recovery_stats.num_workers,
                        "num_samples": result["num_samples"]}
    weights = [p.sum().item() for p in trainer.get_model().parameters()]
    out["weights_finite"] = all(w == w for w in weights)
    finish(trainer, cluster, out)


if __name__ == "__main__":
    main(sys.argv[1])
