"""The raysgd operator for the recovery variant: the bench operator plus a step log.

It lives in the ``bench`` package so Ray workers can import it by name.
"""
from __future__ import annotations

from bench.raysgd_operator import BenchOperator
from bench.recovery.steplog import StepLog


class StepLogOperator(BenchOperator):
    """``config["step_dir"]``: where rank 0 logs each completed step (see ``steplog``);
    ``config["min_step_s"]`` (optional): the shortest a step after
    ``config["floor_after"]`` may take."""

    def setup(self, config):
        super().setup(config)
        import ray

        self.step_log = StepLog(config["step_dir"], self.world_rank,
                                ray.get_runtime_context().get_node_id(),
                                config.get("min_step_s", 0.0), config.get("floor_after", 0))

    def train_batch(self, batch, batch_info):
        metrics = super().train_batch(batch, batch_info)
        self.step_log.completed(batch_info["global_step"] + 1)
        return metrics
