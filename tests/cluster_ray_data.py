"""Run by test_ray_data in its own process: two raylets, one worker on each.

Checks that each worker runs on its own node, that both receive rows of every
pass, and that together they see every row once. Prints ``RESULT ok`` or the
problem.
"""
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["PYTHONPATH"] = os.path.dirname(os.path.abspath(__file__))

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from ray_data_operators import IdOperator  # noqa: E402
from raysgd import DatasetConfig, TorchTrainer  # noqa: E402
from raysgd.utils import BATCH_SIZE  # noqa: E402


def main():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    ds = ray.data.from_items([{"x": float(i), "id": i} for i in range(240)],
                             override_num_blocks=6).map_batches(lambda b: b)  # runs on the cluster
    trainer = TorchTrainer(IdOperator, num_workers=2, use_gpu=False, placement_strategy="SPREAD",
                           config={BATCH_SIZE: 20}, datasets={"train": ds},
                           dataset_config=DatasetConfig(feature_columns=["x"], label_column="id"))
    problems = []
    nodes = trainer.apply_all_workers(lambda: ray.get_runtime_context().get_node_id())
    if len(set(nodes)) != 2:
        problems.append(f"workers share a node: {nodes}")
    for _ in range(2):
        trainer.train()
        per_rank = trainer.apply_all_operators(lambda op: list(op.seen))
        trainer.apply_all_operators(lambda op: op.seen.clear())
        counts = collections.Counter(i for ids in per_rank for i in ids)
        if sorted(counts) != list(range(240)) or max(counts.values()) != 1:
            problems.append(f"rows not seen exactly once: {len(counts)} distinct")
        if [len(ids) for ids in per_rank] != [120, 120]:
            problems.append(f"uneven shards: {[len(ids) for ids in per_rank]}")
    trainer.shutdown()
    ray.shutdown()
    cluster.shutdown()
    print("RESULT " + ("; ".join(problems) or "ok"), flush=True)


if __name__ == "__main__":
    main()
