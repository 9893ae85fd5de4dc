"""Run by test_fsdp in its own process: FSDP on two worker nodes and a driver-only head.

Checks where the sharded commits' copies live (each rank's on the other worker node, none on
the driver's node), removes a worker node mid-epoch (the survivor reshards the commit to one
worker, reading the lost rank's shards from their copy) and adds one back (resharded to
two). Then removes a worker node the moment a commit was taken, before its copy could land
(fault injection: that commit's copy is never started), so the recovery must fall back to
the commit before it. Prints one JSON line with what it saw.
"""
import logging
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
from raysgd.driver.replicas import Landing  # noqa: E402
from raysgd.recovery import FailureConfig  # noqa: E402
from raysgd.utils import BATCH_SIZE  # noqa: E402


def copy_nodes(supervisor):
    """Per rank, the node holding its part of the current commit and the nodes holding that
    part's copy (the driver owns it: its primary copy is pinned where it was made)."""
    point = supervisor.commits.current
    commit, landing = point.payload
    copies = [landing.copies.get(rank) for rank in range(commit.world_size)]
    found = ray.experimental.get_object_locations([ref for ref in copies if ref is not None])
    return [sorted(found[ref]["node_ids"]) if ref is not None else [] for ref in copies]


def lose_the_next_commit_with_its_node(trainer, cluster, node_id):
    """The next commit's copy is never started; instead the node ``node_id`` is removed, before
    the driver takes that commit up: the moment between a commit and its copy's landing, made
    certain. (The removal is done when the call returns, so no later commit can complete.)"""
    group = trainer._supervisor.group
    copy, done = group._copies, threading.Event()

    def copy_or_lose(snapshots, nodes, actors, offset, copiers, slab_ranks=()):
        if done.is_set():
            return copy(snapshots, nodes, actors, offset, copiers, slab_ranks)
        done.set()
        cluster.remove_node(next(n for n in cluster.list_all_nodes() if n.node_id == node_id))
        lost = {rank: node for rank, node in enumerate(nodes) if node == node_id}
        return Landing(lost, failed=set(lost))  # it can never land now

    group._copies = copy_or_lose


class Warnings(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


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
    copies = copy_nodes(trainer._supervisor)
    out["copies"] = {"distinct_rank_nodes": len(set(ranks)) == 2,
                     "each_on_the_other_worker_node": copies == [[ranks[1]], [ranks[0]]],
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

    warnings = Warnings()
    logging.getLogger("raysgd").addHandler(warnings)
    ranks = trainer.apply_all_workers(lambda: ray.get_runtime_context().get_node_id())
    lost_before = trainer.recovery_stats.steps_lost
    lose_the_next_commit_with_its_node(trainer, cluster, ranks[1])
    result = trainer.train()
    out["lost_commit"] = {
        "fell_back": [m for m in warnings.messages if "before its copy landed" in m],
        "epoch": result["epoch"], "workers": trainer.recovery_stats.num_workers,
        "more_steps_lost": trainer.recovery_stats.steps_lost - lost_before,
        "finite": bool(result["train_loss"] == result["train_loss"])}
    finish(trainer, cluster, out)


if __name__ == "__main__":
    main(sys.argv[1])
