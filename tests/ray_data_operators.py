"""Operators for the Ray Data tests; workers import this module by name."""
import time

import torch
from torch import nn

from operators_for_tests import record_pid, record_step
from raysgd import TrainingOperator
from raysgd.worker.metrics import NUM_SAMPLES


class IdOperator(TrainingOperator):
    """Trains a 1→1 linear model on ``(x, id)`` batches and remembers every id it saw
    (``seen`` / ``val_seen``) and each batch's size. ``config``: ``pid_dir`` (writes its
    pid, and rank 0 its step, for a test that kills it), ``sleep_s`` per batch,
    ``register`` (a dataset to pass to ``register_data`` in setup), ``default_loop``
    (train with the inherited ``train_batch``), ``fail_val_at`` (rank 0 raises at that
    validation batch once). Rank 1 refuses to load a state whose ``boom`` is set."""

    def setup(self, config):
        torch.manual_seed(0)
        model = nn.Linear(1, 1)
        self.register(models=model, optimizers=torch.optim.SGD(model.parameters(), lr=1e-3),
                      criterion=nn.MSELoss())
        self.seen, self.val_seen, self.batch_sizes = [], [], []
        if config.get("register") is not None:
            self.register_data(train_loader=config["register"])
        record_pid(config, self.world_rank)

    def train_batch(self, batch, batch_info):
        if self.config.get("default_loop"):
            return super().train_batch(batch, batch_info)
        time.sleep(self.config.get("sleep_s", 0.0))
        record_step(self.config, self.world_rank, batch_info["global_step"])
        x, ids = batch
        self.seen.extend(ids.tolist())
        self.batch_sizes.append(len(ids))
        # A real DDP step: every rank must run as many as the others.
        x = x.float().view(-1, 1)
        return super().train_batch((x, x.clone()), batch_info)

    def state_dict(self):
        return {"boom": False}

    def load_state_dict(self, state):
        if state.get("boom") and self.world_rank == 1:
            raise RuntimeError("bad state on rank 1")

    def validate_batch(self, batch, batch_info):
        if self.world_rank == 0 and batch_info["batch_idx"] == self.config.get("fail_val_at"):
            self.config["fail_val_at"] = None
            raise RuntimeError("validation failed on rank 0")
        x, ids = batch
        self.val_seen.extend(ids.tolist())
        return {"val_loss": float(x.float().mean()), NUM_SAMPLES: len(ids)}
