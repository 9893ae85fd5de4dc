"""The raysgd operator for the Tune variant: the bench operator with the trial's ``lr``.

It lives in the ``bench`` package so Ray workers can import it by name.
"""
from __future__ import annotations

from bench.raysgd_operator import BenchOperator


class LearningRateOperator(BenchOperator):
    """``config["lr"]`` (the trial's) replaces the workload's learning rate."""

    def setup(self, config):
        super().setup(config)
        for group in self.optimizer.param_groups:
            group["lr"] = config["lr"]
