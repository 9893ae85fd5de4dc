"""The raysgd operator for the GPU mode: device-resident batches, the default train_batch.

It lives in its own module (not the variant script, which runs as ``__main__``)
so the class can be imported by name, as raysgd expects of operators.
"""
from __future__ import annotations

from raysgd.torch import TrainingOperator

from bench.gpu.workload import get_workload


class PoolOperator(TrainingOperator):
    """``config``: ``mode`` (quick/full). ``train_batch`` is raysgd's own."""

    def setup(self, config):
        workload = get_workload(config["mode"])
        model = workload.model()
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=workload.optimizer(model), criterion=workload.criterion())
        # A list is a loader raysgd can size and iterate; train(num_steps=k)
        # wraps around it. The batches already sit on self.device, so the
        # default train_batch's move_to_device is a no-op.
        self.register_data(train_loader=workload.pool(self.device))
