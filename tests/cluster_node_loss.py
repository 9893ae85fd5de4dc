"""Run by test_fault_tolerance in its own process: two raylets, one worker each.

Removes the second node mid-epoch, checks training goes on with one worker and
the same global batch, adds a node back and checks the next train() scales up.
Prints one JSON line with what it saw.
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
from operators_for_tests import FaultyOperator  # noqa: E402
from raysgd import TorchTrainer  # noqa: E402
from raysgd.recovery import FailureConfig  # noqa: E402
from raysgd.utils import BATCH_SIZE  # noqa: E402


def main(pid_dir):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    second = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(
        training_operator_cls=FaultyOperator, num_workers=2, use_gpu=False,
        checkpoint_every_n_steps=4, failure_config=FailureConfig(scale_up_cooldown_s=0),
        config={BATCH_SIZE: 32, "pid_dir": pid_dir, "sleep_s": 0.05})
    out = {"first": trainer.train()["num_samples"]}

    def remove_mid_epoch():
        time.sleep(0.4)
        cluster.remove_node(second)

    threading.Thread(target=remove_mid_epoch, daemon=True).start()
    result = trainer.train()
    out["after_loss"] = {"num_samples": result["num_samples"], "epoch": result["epoch"],
                         "workers": trainer.recovery_stats.num_workers,
                         "per_worker_batch": trainer.apply_all_operators(
                             lambda op: op.config[BATCH_SIZE]),
                         "resizes": trainer.recovery_stats.resizes}
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    result = trainer.train()
    out["after_add"] = {"num_samples": result["num_samples"], "epoch": result["epoch"],
                        "workers": trainer.recovery_stats.num_workers,
                        "per_worker_batch": trainer.apply_all_operators(
                            lambda op: op.config[BATCH_SIZE])}
    out["stats"] = {"failures": trainer.recovery_stats.failures,
                    "recoveries": trainer.recovery_stats.recoveries}
    finish(trainer, cluster, out)


if __name__ == "__main__":
    main(sys.argv[1])
