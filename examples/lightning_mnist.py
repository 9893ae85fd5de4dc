"""A PyTorch Lightning module trained by raysgd: handwritten digits on 2 workers, fp32 then bf16.

The LightningModule below is plain Lightning 2.x code (``training_step``,
``validation_step``, ``self.log``, ``configure_optimizers`` with a scheduler
dict); ``TrainingOperator.from_ptl`` turns it into a raysgd operator, and
raysgd runs it with DistributedDataParallel on Ray workers. The data is
scikit-learn's 1,797 8x8 digits (MNIST's small offline cousin: no download).

    python examples/lightning_mnist.py                 # 10 epochs per precision
    python examples/lightning_mnist.py --smoke-test    # 2 epochs, a narrower net
"""
from __future__ import annotations

import argparse
import time

import pytorch_lightning as pl
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

import ray
from raysgd import TorchTrainer, TrainingOperator
from raysgd.torch.examples.digits import DigitsNet, digits_datasets


class DigitsClassifier(pl.LightningModule):
    def __init__(self, config):
        super().__init__()
        torch.manual_seed(config.get("seed", 0))
        self.config = config
        self.net = DigitsNet(config.get("width", 32))

    def forward(self, images):
        return self.net(images)

    def setup(self, stage):
        self.train_set, self.val_set = digits_datasets(self.config.get("seed", 0))

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.config.get("batch_size", 64),
                          shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=256)

    def training_step(self, batch, batch_idx):
        images, labels = batch
        scores = self(images)
        self.log("train_accuracy", (scores.argmax(1) == labels).float().mean())
        return F.cross_entropy(scores, labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        scores = self(images)
        self.log_dict({"val_loss": F.cross_entropy(scores, labels),
                       "val_accuracy": (scores.argmax(1) == labels).float().mean()})

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=self.config.get("lr", 3e-3))
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "epoch"}}


def train(precision, epochs: int, num_workers: int, config: dict) -> float:
    """Train a fresh module for ``epochs`` epochs; returns the final validation accuracy."""
    start = time.perf_counter()
    trainer = TorchTrainer(training_operator_cls=TrainingOperator.from_ptl(DigitsClassifier),
                           num_workers=num_workers, use_fp16=precision, config=config)
    name = {False: "fp32", "bf16": "bf16"}[precision]
    print(f"\n{name}: {'epoch':>5} {'train_loss':>10} {'val_loss':>10} {'val_accuracy':>12}")
    for _ in range(epochs):
        stats, val = trainer.train(), trainer.validate()
        print(f"{'':5} {stats['epoch']:>5} {stats['train_loss']:>10.4f} {val['val_loss']:>10.4f} "
              f"{val['val_accuracy']:>12.4f}", flush=True)
    model = trainer.get_model()  # the trained LightningModule itself
    trainer.shutdown()
    print(f"{name}: validation accuracy: {val['val_accuracy']:.4f} "
          f"({type(model).__name__}, {time.perf_counter() - start:.1f} s)")
    return val["val_accuracy"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-test", action="store_true", help="2 epochs, a narrower net")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    args = parser.parse_args(argv)
    epochs = args.epochs or (2 if args.smoke_test else 10)
    config = {"lr": 3e-3, "batch_size": 64, "width": 16 if args.smoke_test else 32, "seed": 0}
    start = time.perf_counter()
    ray.init(address=args.address, num_cpus=None if args.address else max(2, args.num_workers))
    for precision in (False, "bf16"):
        train(precision, epochs, args.num_workers, config)
    ray.shutdown()
    print(f"\ntotal wall time: {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
