"""raysgd's chaos run: the bench operator plus the chaos step log. In the ``bench`` package so
Ray workers import it by name."""
from __future__ import annotations

from bench.chaos.ranklog import ChaosLog
from bench.raysgd_operator import BenchOperator


class ChaosOperator(BenchOperator):
    """``config["step_dir"]``: where the ranks log their steps and processes."""

    def setup(self, config):
        super().setup(config)
        import ray

        self.chaos_log = ChaosLog(config["step_dir"], ray.get_runtime_context().get_node_id())

    def train_batch(self, batch, batch_info):
        metrics = super().train_batch(batch, batch_info)
        self.chaos_log.completed(self.world_rank, batch_info["global_step"] + 1)
        return metrics
