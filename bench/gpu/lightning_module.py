"""The LightningModule for the GPU mode's Lightning variants: the workload's model, loss and
optimizer, its device-resident batches as the train loader, and the loss logged every step.

Its own module (not the variant script, which runs as ``__main__``), so workers can import
the class by name. Needs ``pytorch_lightning`` (``pip install 'raysgd[lightning]'``).
"""
from __future__ import annotations

from typing import Iterator, List

import pytorch_lightning as pl

from bench.gpu.workload import Batch, get_workload


class Pool:
    """The workload's batches as a loader raysgd can size and iterate (a plain list returned by
    ``train_dataloader`` would read as several loaders, which Lightning's API means by it)."""

    def __init__(self, batches: List[Batch]):
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        return iter(self.batches)


class PoolModule(pl.LightningModule):
    """``config``: ``mode`` (quick/full). Logs its loss each step, as most modules do."""

    def __init__(self, config: dict):
        super().__init__()
        self.workload = get_workload(config["mode"])
        self.model = self.workload.model()
        self.criterion = self.workload.criterion()

    def forward(self, images):
        return self.model(images)

    def training_step(self, batch: Batch, batch_idx: int):
        images, labels = batch
        loss = self.criterion(self(images), labels)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return self.workload.optimizer(self.model)

    def train_dataloader(self) -> Pool:
        return Pool(self.workload.pool(self.device))
