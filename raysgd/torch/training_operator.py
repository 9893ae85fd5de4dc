"""Legacy ``ray.util.sgd.torch.training_operator``: the operator classes, ``amp`` and the
test helpers Ray 1.12's own tests (and some users' tests) import from here.

``TrainingOperator`` and ``CreatorOperator`` are raysgd's (see :mod:`raysgd.operator`).
``amp`` is NVIDIA Apex's ``apex.amp`` when Apex is installed, else ``None``, so the
legacy guard ``if amp: ...`` keeps working; raysgd's own mixed precision is
``TorchTrainer(use_fp16=...)`` on native ``torch.amp``.
"""
from __future__ import annotations

from raysgd.creator_operator import CreatorOperator
from raysgd.operator import TrainingOperator
from raysgd.worker.metrics import NUM_SAMPLES

try:
    from apex import amp  # type: ignore[import-not-found]
except ImportError:
    amp = None
apex_amp = amp  # Ray 1.12's name for the same module

__all__ = ["TrainingOperator", "CreatorOperator", "amp", "apex_amp", "get_test_operator",
           "get_test_metrics_operator"]


def get_test_operator(operator_cls: type) -> type:
    """``operator_cls`` whose ``train_epoch`` and ``validate`` run ``config["custom_func"]``.

    ``custom_func(operator, iterator, info)`` returns the call's metrics; without
    it both hooks return ``{"done": 1}`` and consume nothing.
    """

    class _TestingOperator(operator_cls):
        def train_epoch(self, iterator, info, **kwargs):
            custom = self.config.get("custom_func")
            return custom(self, iterator, info) if callable(custom) else {"done": 1}

        def validate(self, iterator, info, **kwargs):
            return self.train_epoch(iterator, info)

    return _TestingOperator


def get_test_metrics_operator(operator_cls: type) -> type:
    """``operator_cls`` that adds a scripted score to every batch's metrics.

    ``config["key"]`` names the metric; each train (validation) batch pops the
    next value of ``config["scores"]`` (``config["val_scores"]``) and reports
    it divided by the batch's ``num_samples``.
    """

    class _TestMetricsOperator(operator_cls):
        def setup(self, config):
            super().setup(config)
            self._train_scores = list(config["scores"])
            self._val_scores = list(config["val_scores"])
            self.key = config["key"]

        def train_batch(self, batch, batch_info=None):
            return self._scored(super().train_batch(batch, batch_info), self._train_scores)

        def validate_batch(self, batch, batch_info=None):
            return self._scored(super().validate_batch(batch, batch_info), self._val_scores)

        def _scored(self, metrics, scores):
            metrics = dict(metrics)
            metrics[self.key] = scores.pop(0) / metrics[NUM_SAMPLES]
            return metrics

    return _TestMetricsOperator
