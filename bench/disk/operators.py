"""Operators the disk benchmark trains; in the ``bench`` package so Ray workers import them."""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.utils.data import DataLoader

from raysgd.torch import TrainingOperator
from raysgd.torch.examples.digits import DigitsNet, digits_datasets
from raysgd.utils import BATCH_SIZE

from bench.recovery.step_operator import StepLogOperator


class DigitsBenchOperator(TrainingOperator):
    """The demo's model and data (``examples/digits_demo.py``), training only."""

    def setup(self, config):
        torch.manual_seed(0)
        train_set, _ = digits_datasets(0)
        model = DigitsNet(32)
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=torch.optim.Adam(model.parameters(), lr=3e-3),
            criterion=nn.CrossEntropyLoss())
        self.register_data(train_loader=DataLoader(train_set, batch_size=config[BATCH_SIZE],
                                                   shuffle=True))


class PacedStepLogOperator(StepLogOperator):
    """The resume driver's operator: ``config["step_sleep"]`` seconds per step, so that a
    quick-mode step (a few ms) does not outrun the kill and the disk writer."""

    def train_batch(self, batch, batch_info):
        time.sleep(self.config.get("step_sleep", 0.0))
        return super().train_batch(batch, batch_info)
