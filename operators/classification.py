"""Supervised classification: cross-entropy training, accuracy and top-k validation."""
from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn

from raysgd import TrainingOperator
from raysgd.utils import NUM_SAMPLES, move_to_device

from operators import _config


class ClassificationOperator(TrainingOperator):
    """Train any classifier with the default loop (precision, clipping, accumulation).

    ``config`` keys:

    - ``model_creator(config) -> nn.Module`` producing class scores (required);
    - ``data_creator(config) -> (train_loader, validation_loader)`` of ``(inputs, labels)``
      batches (required; validation may be None);
    - ``optimizer_creator(params, config)`` (default: SGD, ``lr`` 0.1, ``momentum`` 0.9);
    - ``topk``: the k values reported as ``val_top<k>_accuracy`` (default ``(1, 5)``, each
      capped at the number of classes); ``label_smoothing`` (default 0).

    Validation reports ``val_loss``, ``val_accuracy`` (top-1) and ``val_top<k>_accuracy``
    for every other k.
    """

    def setup(self, config: Dict[str, Any]) -> None:
        model = _config.creator(config, "model_creator", "nn.Module")(config)
        criterion = nn.CrossEntropyLoss(label_smoothing=config.get("label_smoothing", 0.0))
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=_config.optimizer(config, model.parameters()),
            criterion=criterion)
        train_loader, val_loader = _config.loaders(config)
        self.register_data(train_loader=train_loader, validation_loader=val_loader)
        self.topk = tuple(config.get("topk", (1, 5)))

    def validate_batch(self, batch: Any, batch_info: dict) -> dict:
        inputs, labels = move_to_device(batch, self.device)
        with self.autocast():
            scores = self.model(inputs)
            loss = self.criterion(scores, labels)
        accuracies = topk_accuracy(scores.float(), labels, set(self.topk) | {1})
        metrics = {"val_loss": loss.item(), "val_accuracy": accuracies.pop("val_top1_accuracy"),
                   NUM_SAMPLES: labels.size(0)}
        metrics.update({key: value for key, value in accuracies.items()
                        if int(key[len("val_top"):-len("_accuracy")]) in self.topk})
        return metrics


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, ks) -> Dict[str, float]:
    """Fraction of rows whose label is among the k highest scores, for each k."""
    top = scores.topk(min(max(ks), scores.size(1)), dim=1).indices
    hits = top == labels.unsqueeze(1)
    return {f"val_top{k}_accuracy": hits[:, :min(k, scores.size(1))].any(dim=1).float().mean().item()
            for k in ks}
