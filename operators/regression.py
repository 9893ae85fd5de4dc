"""Regression: MSE (or Huber) training, MSE and MAE validation."""
from __future__ import annotations

from typing import Any, Dict

from torch import nn

from raysgd import ConfigError, TrainingOperator
from raysgd.utils import NUM_SAMPLES, move_to_device

from operators import _config

LOSSES = {"mse": nn.MSELoss, "huber": nn.HuberLoss, "l1": nn.L1Loss}


class RegressionOperator(TrainingOperator):
    """Fit any regressor with the default loop.

    ``config`` keys: ``model_creator(config)`` and ``data_creator(config) -> (train_loader,
    validation_loader)`` of ``(inputs, targets)`` batches (required); ``optimizer_creator``
    (default SGD, ``lr`` 0.1, ``momentum`` 0.9); ``loss``: ``"mse"`` (default), ``"huber"``
    or ``"l1"``. Validation reports ``val_loss``, ``val_mse`` and ``val_mae``.
    """

    def setup(self, config: Dict[str, Any]) -> None:
        model = _config.creator(config, "model_creator", "nn.Module")(config)
        loss = config.get("loss", "mse")
        if loss not in LOSSES:
            raise ConfigError(f"config['loss']={loss!r}; use one of {sorted(LOSSES)}.")
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=_config.optimizer(config, model.parameters()),
            criterion=LOSSES[loss]())
        train_loader, val_loader = _config.loaders(config)
        self.register_data(train_loader=train_loader, validation_loader=val_loader)

    def validate_batch(self, batch: Any, batch_info: dict) -> dict:
        inputs, targets = move_to_device(batch, self.device)
        with self.autocast():
            output = self.model(inputs)
            loss = self.criterion(output, targets)
        error = output.float() - targets.float()
        return {"val_loss": loss.item(), "val_mse": error.pow(2).mean().item(),
                "val_mae": error.abs().mean().item(), NUM_SAMPLES: targets.size(0)}
