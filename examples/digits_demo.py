"""The demo: a small CNN on scikit-learn's handwritten digits with 2 workers.

Runs on an embedded local Ray (no download: the 1,797 8x8 digits ship with
scikit-learn), prints per-epoch metrics, saves a checkpoint, reloads it into a
fresh trainer and shows the same validation accuracy.

    make demo            # or: python examples/digits_demo.py --epochs 10
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader

import ray
from raysgd import TorchTrainer
from raysgd.torch import TrainingOperator
from raysgd.torch.examples.digits import DigitsNet, digits_datasets
from raysgd.utils import BATCH_SIZE


class DigitsOperator(TrainingOperator):
    def setup(self, config):
        torch.manual_seed(config.get("seed", 0))
        train_set, val_set = digits_datasets(config.get("seed", 0))
        model = DigitsNet(config.get("width", 32))
        optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 3e-3))
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=optimizer, criterion=nn.CrossEntropyLoss())
        self.register_data(
            train_loader=DataLoader(train_set, batch_size=config[BATCH_SIZE], shuffle=True),
            validation_loader=DataLoader(val_set, batch_size=config[BATCH_SIZE]))


def make_trainer(num_workers: int, use_gpu: bool = False) -> TorchTrainer:
    return TorchTrainer(training_operator_cls=DigitsOperator, num_workers=num_workers,
                        use_gpu=use_gpu, config={"lr": 3e-3, BATCH_SIZE: 64, "seed": 0})


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    args = parser.parse_args(argv)
    ray.init(address=args.address, num_cpus=None if args.address else max(4, args.num_workers))
    trainer = make_trainer(args.num_workers, args.use_gpu)
    print(f"{'epoch':>5} {'train_loss':>10} {'val_loss':>10} {'val_accuracy':>12}")
    for _ in range(args.epochs):
        train, val = trainer.train(), trainer.validate()
        print(f"{train['epoch']:>5} {train['train_loss']:>10.4f} {val['val_loss']:>10.4f} "
              f"{val['val_accuracy']:>12.4f}", flush=True)
    path = trainer.save(os.path.join(tempfile.mkdtemp(prefix="raysgd-demo-"), "digits.pt"))
    accuracy = trainer.validate()["val_accuracy"]
    trainer.shutdown()

    restored = make_trainer(args.num_workers, args.use_gpu)
    restored.load(path)
    reloaded = restored.validate()["val_accuracy"]
    restored.shutdown()
    print(f"\ncheckpoint: {path}")
    print(f"validation accuracy before save: {accuracy:.4f}, after reload into a fresh trainer: "
          f"{reloaded:.4f}")
    ray.shutdown()
    return reloaded


if __name__ == "__main__":
    main()
