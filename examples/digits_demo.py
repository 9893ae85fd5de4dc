"""The demo: a small CNN on scikit-learn's handwritten digits with 2 workers.

Runs on an embedded local Ray (no download: the 1,797 8x8 digits ship with
scikit-learn) and prints per-epoch metrics. Every epoch is checkpointed to a
run directory (``runs/digits-demo`` by default) with ``metrics.csv`` beside it;
the demo then reloads the latest checkpoint into a fresh trainer, shows the
same validation accuracy, and draws the curves to ``curves.png``.

Run it again and it resumes from that directory instead of starting over
(stop it mid-run with Ctrl-C, or kill it, and it picks up from the last
checkpoint); ``--epochs 12`` trains further, ``--fresh`` starts a new run.

    make demo            # or: python examples/digits_demo.py --epochs 10
"""
from __future__ import annotations

import argparse
import json
import os

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


def make_trainer(num_workers: int, use_gpu: bool = False, **run) -> TorchTrainer:
    return TorchTrainer(training_operator_cls=DigitsOperator, num_workers=num_workers,
                        use_gpu=use_gpu, config={"lr": 3e-3, BATCH_SIZE: 64, "seed": 0}, **run)


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--run-dir", default=os.path.join("runs", "digits-demo"),
                        help="checkpoints, metrics.csv and curves.png go here")
    parser.add_argument("--fresh", action="store_true", help="start over instead of resuming")
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    args = parser.parse_args(argv)
    ray.init(address=args.address, num_cpus=None if args.address else max(4, args.num_workers))
    trainer = make_trainer(args.num_workers, args.use_gpu, checkpoint_dir=args.run_dir,
                           resume=not args.fresh, checkpoint_score_attr="val_accuracy")
    if trainer.epoch:
        print(f"resumed from {args.run_dir}: {trainer.epoch} epoch(s) already trained")
    print(f"{'epoch':>5} {'train_loss':>10} {'val_loss':>10} {'val_accuracy':>12}")
    val = None
    while trainer.epoch < args.epochs:
        train, val = trainer.train(), trainer.validate()
        print(f"{train['epoch']:>5} {train['train_loss']:>10.4f} {val['val_loss']:>10.4f} "
              f"{val['val_accuracy']:>12.4f}", flush=True)
    accuracy = (val or trainer.validate())["val_accuracy"]
    trainer.shutdown()  # waits for the last checkpoint to reach the disk
    latest = latest_checkpoint(args.run_dir)

    restored = make_trainer(args.num_workers, args.use_gpu)
    restored.load(latest)
    reloaded = restored.validate()["val_accuracy"]
    restored.shutdown()
    ray.shutdown()
    print(f"\ncheckpoint directory: {os.path.abspath(args.run_dir)} (latest: "
          f"{os.path.basename(latest)}, best by val_accuracy: best.pt)")
    print(f"validation accuracy before save: {accuracy:.4f}, after reload into a fresh trainer: "
          f"{reloaded:.4f}")
    print(f"metrics: {os.path.abspath(os.path.join(args.run_dir, 'metrics.csv'))}")
    print(f"curves: {draw_curves(args.run_dir)}")
    print(f"run it again to resume from {args.run_dir} (--epochs N trains further, --fresh "
          "starts over)")
    return reloaded


def latest_checkpoint(run_dir: str) -> str:
    with open(os.path.join(run_dir, "index.json")) as handle:
        return os.path.join(run_dir, json.load(handle)["latest"])


def draw_curves(run_dir: str) -> str:
    try:
        from raysgd.plot import plot_run

        return plot_run(run_dir)
    except ImportError as exc:  # matplotlib is optional
        return f"not drawn ({exc})"


if __name__ == "__main__":
    main()
