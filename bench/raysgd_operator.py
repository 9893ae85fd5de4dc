"""The raysgd operator for the benchmark: registers the workload, keeps the default loop.

It lives in the ``bench`` package so Ray workers can import it by name.
"""
from __future__ import annotations

from raysgd.torch import TrainingOperator
from raysgd.utils import BATCH_SIZE

from bench.workloads import get_workload


class BenchOperator(TrainingOperator):
    """``config``: ``workload``, ``mode`` and the global ``BATCH_SIZE`` (split by raysgd)."""

    def setup(self, config):
        workload = get_workload(config["workload"], config["mode"])
        model = workload.model()
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=workload.optimizer(model), criterion=workload.criterion())
        self.register_data(train_loader=workload.loader(config[BATCH_SIZE]))
