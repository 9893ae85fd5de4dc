"""A training script the resume tests run as a driver process (and SIGKILL).

    python tests/resume_driver.py --dir RUN_DIR --out WEIGHTS.pt [--epochs 4] [--strategy fsdp]
                                  [--hang-at STEP]

Trains a small MLP with dropout on shuffled data on 2 workers, writing a disk
checkpoint every 4 steps, with ``while trainer.epoch < epochs: trainer.train()``,
then saves rank 0's final weights to ``--out``. Run it again on the same
``--dir`` and it resumes where the previous run's checkpoints end. With ``--hang-at``,
every rank stops (sleeps) before the batch of that global step, once the step's checkpoint
is committed: a test kills the driver there, at a point it knows, however slow the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ray
from raysgd import FSDP, TorchTrainer
from raysgd.torch import TrainingOperator
from raysgd.utils import BATCH_SIZE


class DropoutMLPOperator(TrainingOperator):
    """Uses every RNG a resume must restore: data order, dropout, initial weights."""

    def setup(self, config):
        torch.manual_seed(0)
        data = torch.randn(512, 8, generator=torch.Generator().manual_seed(1))
        target = data.sum(dim=1, keepdim=True) + 0.1 * torch.randn(
            512, 1, generator=torch.Generator().manual_seed(2))
        model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
        self.model, self.optimizer, self.criterion, self.scheduler = self.register(
            models=model, optimizers=optimizer, criterion=nn.MSELoss(), schedulers=scheduler)
        self.register_data(train_loader=DataLoader(TensorDataset(data, target),
                                                   batch_size=config[BATCH_SIZE], shuffle=True))

    def train_batch(self, batch, batch_info):
        hang_at = self.config.get("hang_at")
        if hang_at is not None and batch_info["global_step"] >= hang_at:
            time.sleep(3600)  # until the test kills the driver
        time.sleep(self.config.get("step_sleep", 0.0))
        return super().train_batch(batch, batch_info)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--step-sleep", type=float, default=0.05)
    parser.add_argument("--hang-at", type=int, default=None)
    # fsdp: DCP checkpoint directories; fsdp-async: written in the background (GPUs' default)
    parser.add_argument("--strategy", default="ddp")
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    started = time.time()
    trainer = TorchTrainer(DropoutMLPOperator, num_workers=2, use_gpu=False,
                           config={BATCH_SIZE: 32, "step_sleep": args.step_sleep,
                                   "hang_at": args.hang_at},
                           scheduler_step_freq="batch", checkpoint_dir=args.dir,
                           checkpoint_every_n_steps=4, checkpoint_every_n_steps_to_disk=4,
                           strategy=FSDP(async_checkpoints=True)
                           if args.strategy == "fsdp-async" else args.strategy)
    print(json.dumps({"constructed_s": time.time() - started, "epoch": trainer.epoch}), flush=True)
    while trainer.epoch < args.epochs:
        metrics = trainer.train()
        print(json.dumps({"epoch": metrics["epoch"], "train_loss": metrics["train_loss"]}),
              flush=True)
    model = trainer.get_model()
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.out + ".tmp")
    os.replace(args.out + ".tmp", args.out)
    trainer.shutdown()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
