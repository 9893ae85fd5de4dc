"""Sharded training (FSDP): a residual MLP built on the meta device, trained on 2 workers.

The operator is a plain ``TrainingOperator``: it builds the model and its optimizer in
``setup()`` and registers them, exactly as for DDP. ``strategy=raysgd.FSDP(units=Block)``
makes each ``Block`` a shard unit; because the model is built under
``torch.device("meta")``, no worker ever allocates all of it: raysgd shards it first, then
allocates each worker's shards and initialises them (``reset_parameters()``, or
``FSDP(init_weights=...)``). ``trainer.save()`` writes the usual unsharded checkpoint,
which this script loads into a plain ``nn.Module`` at the end. With ``--checkpoint-dir``
every rank also writes its shards there (torch's DCP format) as it trains, and the same
command run again resumes from them, at any ``--num-workers``.

    python examples/fsdp_example.py                  # 2 workers, 4 epochs
    python examples/fsdp_example.py --smoke-test     # a small, fast run
    python examples/fsdp_example.py --checkpoint-dir runs/fsdp   # resumable
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ray
import raysgd
from raysgd import TorchTrainer, TrainingOperator
from raysgd.utils import BATCH_SIZE


class Block(nn.Module):
    """One residual block: the unit FSDP gathers before its forward and frees after it."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


def build(width: int, depth: int) -> nn.Module:
    return nn.Sequential(nn.Linear(16, width), *[Block(width) for _ in range(depth)],
                         nn.Linear(width, 1))


def dataset(size: int) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, 16, generator=g)
    y = torch.sin(x[:, :4].sum(dim=1, keepdim=True)) + 0.1 * x[:, 4:5]
    return TensorDataset(x, y)


class ShardedOperator(TrainingOperator):
    def setup(self, config):
        torch.manual_seed(0)
        with torch.device("meta"):  # no memory yet: raysgd shards, then allocates
            model = build(config["width"], config["depth"])
        optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=optimizer, criterion=nn.MSELoss())
        self.register_data(
            train_loader=DataLoader(dataset(config["rows"]), batch_size=config[BATCH_SIZE],
                                    shuffle=True),
            validation_loader=DataLoader(dataset(512), batch_size=256))


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--smoke-test", action="store_true")
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="sharded disk checkpoints here; run again to resume")
    args = parser.parse_args(argv)
    if args.smoke_test:
        args.epochs, args.width, args.depth = 2, 64, 3
    ray.init(address=args.address, num_cpus=None if args.address else max(4, args.num_workers))
    config = {"width": args.width, "depth": args.depth, "lr": 1e-3, BATCH_SIZE: 64,
              "rows": 1024 if args.smoke_test else 8192}
    trainer = TorchTrainer(ShardedOperator, num_workers=args.num_workers, use_gpu=False,
                           config=config, strategy=raysgd.FSDP(units=Block),
                           checkpoint_dir=args.checkpoint_dir)
    params = sum(p.numel() for p in build(args.width, args.depth).parameters())
    print(f"model: {params / 1e6:.2f}M parameters, sharded over {args.num_workers} workers")
    while trainer.epoch < args.epochs:  # counts a resumed run's epochs too
        train = trainer.train()
        val = trainer.validate()
        print(f"epoch {trainer.epoch}: train_loss {train['train_loss']:.4f}, "
              f"val_loss {val['val_loss']:.4f}")
    with tempfile.TemporaryDirectory() as tmp:
        path = trainer.save(os.path.join(tmp, "model.pt"))  # unsharded, DDP's format
        trainer.shutdown()
        plain = build(args.width, args.depth)
        plain.load_state_dict(torch.load(path, weights_only=True)["models"][0])
    x, y = dataset(512).tensors
    with torch.no_grad():
        loss = nn.functional.mse_loss(plain(x), y).item()
    print(f"the saved checkpoint in a plain nn.Module: val_loss {loss:.4f}")
    ray.shutdown()
    return loss


if __name__ == "__main__":
    main()
