"""The raysgd operator for the Ray Data variant: the bench model, no ``register_data``.

The trainer's ``datasets=`` feeds the default loop; it lives in the ``bench``
package so Ray workers can import it by name.
"""
from __future__ import annotations

from raysgd.torch import TrainingOperator

from bench.workloads import get_workload


class RayDataOperator(TrainingOperator):
    """``config``: ``workload`` and ``mode``; the batches come from the trainer's dataset."""

    def setup(self, config):
        workload = get_workload(config["workload"], config["mode"])
        model = workload.model()
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=workload.optimizer(model), criterion=workload.criterion())
