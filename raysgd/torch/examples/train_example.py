"""The legacy linear example: learn ``y = a * x + b`` (``ray.util.sgd.torch.examples.train_example``)."""
from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from raysgd.utils import BATCH_SIZE


class LinearDataset(Dataset):
    """``size`` points ``x`` in [0, 10) with targets ``y = a * x + b``, as float32 column vectors."""

    def __init__(self, a: float, b: float, size: int = 1000):
        x = np.arange(0, 10, 10 / size, dtype=np.float32)
        self.x = torch.from_numpy(x)
        self.y = torch.from_numpy((a * x + b).astype(np.float32))

    def __getitem__(self, index):
        return self.x[index, None], self.y[index, None]

    def __len__(self) -> int:
        return len(self.x)


def model_creator(config):
    return nn.Linear(1, config.get("hidden_size", 1))


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))


def scheduler_creator(optimizer, config):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)


def data_creator(config):
    batch_size = config.get(BATCH_SIZE, config.get("batch_size", 32))
    train_loader = DataLoader(LinearDataset(2, 5, size=config.get("data_size", 1000)),
                              batch_size=batch_size)
    val_loader = DataLoader(LinearDataset(2, 5, size=config.get("val_size", 400)),
                            batch_size=batch_size)
    return train_loader, val_loader


def train_example(num_workers: int = 1, use_gpu: bool = False, epochs: int = 5,
                  use_tqdm: bool = False):
    """Train for ``epochs`` epochs, print the metrics and the learned line; returns the model."""
    from raysgd import TorchTrainer
    from raysgd.torch import TrainingOperator
    from raysgd.torch.examples._cluster import client_connected

    operator = TrainingOperator.from_creators(
        model_creator=model_creator, optimizer_creator=optimizer_creator,
        data_creator=data_creator, scheduler_creator=scheduler_creator, loss_creator=nn.MSELoss)
    trainer = TorchTrainer(training_operator_cls=operator, num_workers=num_workers,
                           use_gpu=use_gpu, scheduler_step_freq="epoch", use_tqdm=use_tqdm,
                           config={"lr": 1e-2, "hidden_size": 1, BATCH_SIZE: 32})
    for _ in range(epochs):
        stats = trainer.train()
        print(stats)
    print(trainer.validate())
    # A Ray Client driver may have no GPU: bring the model back on the CPU there.
    model = trainer.get_model(to_cpu=client_connected())
    print("trained weight:", model.weight.item(), "bias:", model.bias.item())
    trainer.shutdown()
    return model


def main(argv=None) -> None:
    """``python examples/train_example.py [--smoke-test] [--num-workers N] [--use-gpu]
    [--address auto | --server-address HOST:PORT] [--epochs E] [--tqdm]``"""
    from raysgd.torch.examples._cluster import add_cluster_flags, init_ray

    parser = argparse.ArgumentParser(description="Fit y = 2x + 5 with a linear model.")
    parser.add_argument("--smoke-test", action="store_true", help="1 worker, 2 epochs")
    add_cluster_flags(parser, num_workers=2)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--tqdm", action="store_true", help="a progress bar per call")
    args = parser.parse_args(argv)
    init_ray(args, num_cpus=max(args.num_workers, 2))
    workers, epochs = (1, 2) if args.smoke_test else (args.num_workers, args.epochs)
    train_example(num_workers=workers, use_gpu=args.use_gpu, epochs=epochs,
                  use_tqdm="always" if args.tqdm else False)


if __name__ == "__main__":
    main()
