"""Operators shared by the tests; importable on Ray workers (see conftest)."""
import os
import signal

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from raysgd.torch import TrainingOperator
from raysgd.torch.examples.train_example import LinearDataset
from raysgd.utils import BATCH_SIZE


def record_pid(config, rank):
    """With ``config['pid_dir']``, write this worker's pid to ``<pid_dir>/rank<rank>``, so a
    test can kill it."""
    pid_dir = config.get("pid_dir")
    if pid_dir:
        with open(os.path.join(pid_dir, f"rank{rank}"), "w") as handle:
            handle.write(str(os.getpid()))


def read_step(pid_dir):
    """The step rank 0 recorded last in ``pid_dir`` (``record_step``), or -1."""
    try:
        with open(os.path.join(pid_dir, "step")) as handle:
            return int(handle.read())
    except (FileNotFoundError, ValueError):
        return -1


def record_step(config, rank, step):
    """With ``config['pid_dir']``, rank 0 writes the step it is at to ``<pid_dir>/step``
    (atomically), so a test can kill at a chosen step."""
    pid_dir = config.get("pid_dir")
    if pid_dir and rank == 0:
        with open(os.path.join(pid_dir, "step.tmp"), "w") as handle:
            handle.write(str(step))
        os.replace(os.path.join(pid_dir, "step.tmp"), os.path.join(pid_dir, "step"))


class LinearOperator(TrainingOperator):
    """The seed's custom operator on the linear data."""

    def setup(self, config):
        torch.manual_seed(config.get("seed", 0))
        batch = config.get(BATCH_SIZE, 32)
        train_loader = DataLoader(LinearDataset(2, 5, size=config.get("data_size", 1000)),
                                  batch_size=batch, shuffle=config.get("shuffle", False))
        val_loader = DataLoader(LinearDataset(2, 5, size=config.get("val_size", 400)), batch_size=batch)
        model = nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-2))
        criterion = nn.MSELoss()
        kwargs = {}
        if config.get("scheduler"):
            kwargs["schedulers"] = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        registered = self.register(models=model, optimizers=optimizer, criterion=criterion, **kwargs)
        self.model, self.optimizer, self.criterion = registered[:3]
        self.register_data(train_loader=train_loader, validation_loader=val_loader)
        self.extra = {"setup_pid": os.getpid()}

    def state_dict(self):
        return {"note": self.config.get("note", "none")}

    def load_state_dict(self, state):
        self.loaded_note = state["note"]


class PeerDied(RuntimeError):
    """Stands for the DistError a survivor sees when a peer dies in a collective."""


class DropoutOperator(LinearOperator):
    """Draws from torch, numpy and python RNGs every batch, so resume must restore them. With
    ``fail_at`` set, the batch of that global step dies after its backward, before its step
    (where DDP's all-reduce fails when a peer died)."""

    fail_at = None

    def setup(self, config):
        super().setup(config)
        self.dropout = nn.Dropout(0.5)

    def train_batch(self, batch, batch_info):
        import random

        features, target = batch
        noise = float(np.random.rand()) + random.random()
        output = self.model(self.dropout(features) + noise * 0.01)
        loss = self.criterion(output, target)
        self.optimizer.zero_grad()
        self.backward(loss)
        if batch_info["global_step"] == self.fail_at:
            raise PeerDied("the all-reduce lost a peer")
        self.step(self.optimizer)
        return {"train_loss": loss.item(), "num_samples": target.size(0)}


class UnevenOperator(TrainingOperator):
    """Rank r holds (r + 1) * 10 samples of a constant loss r, batch 10, no sampler."""

    def setup(self, config):
        model = nn.Linear(1, 1)
        self.register(models=model, optimizers=torch.optim.SGD(model.parameters(), lr=0.0),
                      criterion=nn.MSELoss())
        n = (self.world_rank + 1) * 10
        data = TensorDataset(torch.zeros(n, 1), torch.zeros(n, 1))
        self.register_data(train_loader=DataLoader(data, batch_size=10),
                           validation_loader=DataLoader(data, batch_size=10))

    def train_batch(self, batch, batch_info):
        value = float(self.world_rank)
        if self.config.get("nan_rank") == self.world_rank:
            value = float("nan")
        return {"loss": value, "num_samples": batch[0].shape[0], "tag": f"rank{self.world_rank}"}


class NoRegisterOperator(TrainingOperator):
    def setup(self, config):
        self.model = nn.Linear(1, 1)


class FailingOperator(LinearOperator):
    """Raises ValueError in train_batch on ``config['fail_rank']``."""

    def train_batch(self, batch, batch_info):
        if self.world_rank == self.config.get("fail_rank", 0) and batch_info["batch_idx"] >= 1:
            raise ValueError(f"bad batch on rank {self.world_rank}")
        return super().train_batch(batch, batch_info)


class SetupFailOperator(TrainingOperator):
    def setup(self, config):
        if self.world_rank == config.get("fail_rank", 0):
            raise KeyError("missing-key-in-setup")
        model = nn.Linear(1, 1)
        self.register(models=model, optimizers=torch.optim.SGD(model.parameters(), lr=0.1))


class NoDataOperator(TrainingOperator):
    def setup(self, config):
        model = nn.Linear(1, 1)
        self.register(models=model, optimizers=torch.optim.SGD(model.parameters(), lr=0.1),
                      criterion=nn.MSELoss())


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1), nn.Sigmoid())

    def forward(self, x):
        return self.net(x)


class Generator(nn.Module):
    def __init__(self, latent_dim=2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(latent_dim, 8), nn.ReLU(), nn.Linear(8, 4))

    def forward(self, z):
        return self.net(z)


class GANOperator(TrainingOperator):
    """The seed's GAN-style operator: two models, two optimizers, custom train_batch."""

    def setup(self, config):
        torch.manual_seed(0)
        discriminator, generator = Discriminator(), Generator(config["latent_dim"])
        opt_d = torch.optim.Adam(discriminator.parameters(), lr=config.get("lr", 0.01), betas=(0.5, 0.999))
        opt_g = torch.optim.Adam(generator.parameters(), lr=config.get("lr", 0.01), betas=(0.5, 0.999))
        self.models, self.optimizers, self.criterion = self.register(
            models=(discriminator, generator), optimizers=(opt_d, opt_g), criterion=nn.BCELoss())
        real = torch.randn(256, 4) * 0.5 + 2.0
        self.register_data(train_loader=DataLoader(real, batch_size=config.get(BATCH_SIZE, 32)))

    def train_batch(self, batch, batch_info):
        discriminator, generator = self.models
        optimizer_d, optimizer_g = self.optimizers
        adversarial_loss = self.criterion
        valid = torch.ones(batch.shape[0], 1)
        fake = torch.zeros(batch.shape[0], 1)
        z = torch.tensor(np.random.normal(0, 1, (batch.shape[0], self.config["latent_dim"])),
                         dtype=torch.float32)
        optimizer_g.zero_grad()
        gen = generator(z)
        g_loss = adversarial_loss(discriminator(gen), valid)
        self.backward(g_loss)
        self.step(optimizer_g)
        optimizer_d.zero_grad()
        real_loss = adversarial_loss(discriminator(batch), valid)
        fake_loss = adversarial_loss(discriminator(gen.detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.backward(d_loss)
        self.step(optimizer_d)
        return {"loss_g": g_loss.item(), "loss_d": d_loss.item(), "num_samples": batch.shape[0]}


class CustomDataParallel(nn.Module):
    """A user's own wrapper (wrap_ddp=False): averages gradients by hand."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *args):
        return self.module(*args)

    def sync_gradients(self):
        import torch.distributed as dist

        if dist.is_initialized():
            for param in self.module.parameters():
                dist.all_reduce(param.grad)
                param.grad /= dist.get_world_size()


class CustomWrapperOperator(LinearOperator):
    def setup(self, config):
        super().setup(config)
        self.new_model = CustomDataParallel(self.model)

    def train_batch(self, batch, batch_info):
        features, target = batch
        output = self.new_model(features)
        loss = self.criterion(output, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.new_model.sync_gradients()
        self.optimizer.step()
        return {"loss": loss, "num_samples": features.shape[0],
                "is_ddp": float(isinstance(self.model, nn.parallel.DistributedDataParallel))}


class LegacyEpochOperator(LinearOperator):
    """Overrides train_epoch with the old (self, iterator, info) signature."""

    def train_epoch(self, iterator, info):
        count = 0
        for batch in iterator:
            self.train_batch(batch, {"batch_idx": count})
            count += 1
        return {"custom_batches": count, "num_samples": count, "info_value": info.get("value", -1)}


class SlowOperator(LinearOperator):
    """Sleeps in every batch so a test can kill a worker mid-epoch."""

    def train_batch(self, batch, batch_info):
        import time

        time.sleep(self.config.get("sleep_s", 0.05))
        return super().train_batch(batch, batch_info)


class FaultyOperator(TrainingOperator):
    """Shuffled data, dropout and numpy noise: a resume is exact only if every RNG,
    the sampler epoch and the data position come back. Writes its pid to
    ``config['pid_dir']`` so a test can kill it; sleeps ``sleep_s`` per batch."""

    def setup(self, config):
        torch.manual_seed(0)
        np.random.seed(self.world_rank)  # a fresh process's numpy RNG is seeded from the OS
        g = torch.Generator().manual_seed(1)
        x = torch.randn(config.get("data_size", 512), 8, generator=g)
        y = (x.sum(dim=1, keepdim=True) > 0).float()
        # batch norm: buffers every forward writes (a survivor's state then moved mid-batch)
        norm = [nn.BatchNorm1d(16)] if config.get("batchnorm") else []
        model = nn.Sequential(nn.Linear(8, 16), *norm, nn.ReLU(), nn.Dropout(0.2),
                              nn.Linear(16, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=optimizer, criterion=nn.BCEWithLogitsLoss())
        self.register_data(train_loader=DataLoader(TensorDataset(x, y), batch_size=config[BATCH_SIZE],
                                                   shuffle=True),
                           validation_loader=DataLoader(TensorDataset(x, y), batch_size=64))
        record_pid(config, self.world_rank)

    def train_batch(self, batch, batch_info):
        import time

        time.sleep(self.config.get("sleep_s", 0.0))
        record_step(self.config, self.world_rank, batch_info["global_step"])
        hang_flag = self.config.get("hang_once_flag")
        if hang_flag and self.world_rank == 1 and batch_info["global_step"] == 5 \
                and not os.path.exists(hang_flag):
            open(hang_flag, "w").close()
            time.sleep(3600)  # hangs once; the recovered run passes this step
        features, target = batch
        features = features + 0.01 * torch.from_numpy(np.random.rand(*features.shape).astype("float32"))
        return super().train_batch((features, target), batch_info)


class PrecisionGANOperator(TrainingOperator):
    """A GAN loop written with every helper: autocast, backward, clip, step."""

    def setup(self, config):
        torch.manual_seed(0)
        discriminator = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        generator = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 4))
        opt_d = torch.optim.Adam(discriminator.parameters(), lr=0.01, betas=(0.5, 0.999))
        opt_g = torch.optim.Adam(generator.parameters(), lr=0.01, betas=(0.5, 0.999))
        self.models, self.optimizers, self.criterion = self.register(
            models=(discriminator, generator), optimizers=(opt_d, opt_g),
            criterion=nn.BCEWithLogitsLoss())
        real = torch.randn(512, 4) * 0.5 + 2.0
        self.register_data(train_loader=DataLoader(real, batch_size=config.get(BATCH_SIZE, 64)))

    def train_batch(self, batch, batch_info):
        discriminator, generator = self.models
        opt_d, opt_g = self.optimizers
        batch = batch.to(self.device)
        valid = torch.ones(batch.shape[0], 1, device=self.device)
        fake = torch.zeros_like(valid)
        z = torch.randn(batch.shape[0], 2, device=self.device)
        with self.autocast():
            generated = generator(z)
            g_loss = self.criterion(discriminator(generated), valid)
        opt_g.zero_grad()
        self.backward(g_loss)
        self.clip_grad_norm_(generator, 5.0)
        self.step(opt_g)
        with self.autocast():
            real_loss = self.criterion(discriminator(batch), valid)
            fake_loss = self.criterion(discriminator(generated.detach()), fake)
        opt_d.zero_grad()
        self.backward(real_loss, fake_loss)  # several losses in one call
        self.step(opt_d)
        return {"loss_g": g_loss.item(), "loss_d": (real_loss + fake_loss).item() / 2,
                "mean_distance": (generated.float().mean(0) - 2.0).abs().mean().item(),
                "num_samples": batch.shape[0]}


class ConvOperator(TrainingOperator):
    """A small conv net on a learnable synthetic image task (class = brightest quadrant)."""

    def setup(self, config):
        torch.manual_seed(config.get("seed", 0))
        images = torch.rand(512, 1, 8, 8)
        quadrants = torch.stack([images[:, 0, :4, :4].mean((1, 2)), images[:, 0, :4, 4:].mean((1, 2)),
                                 images[:, 0, 4:, :4].mean((1, 2)), images[:, 0, 4:, 4:].mean((1, 2))], 1)
        labels = quadrants.argmax(1)
        model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                              nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 4))
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=optimizer, criterion=nn.CrossEntropyLoss())
        data = TensorDataset(images, labels)
        self.register_data(train_loader=DataLoader(data, batch_size=config.get(BATCH_SIZE, 64),
                                                   shuffle=True),
                           validation_loader=DataLoader(data, batch_size=128))


class SyncCountingOperator(LinearOperator):
    """Counts DDP gradient all-reduces through a communication hook."""

    def setup(self, config):
        super().setup(config)
        self.allreduces = 0
        if hasattr(self.model, "register_comm_hook"):
            self.model.register_comm_hook(None, self._counting_hook)

    def _counting_hook(self, state, bucket):
        self.allreduces += 1
        tensor = bucket.buffer().div_(self.world_size)
        work = torch.distributed.all_reduce(tensor, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    def train_batch(self, batch, batch_info):
        before = self.allreduces
        metrics = super().train_batch(batch, batch_info)
        return {**metrics, "allreduces": self.allreduces - before}


class OriginOperator(LinearOperator):
    """Carries a random ``origin`` through checkpoints, to see whose state a trial holds."""

    def setup(self, config):
        super().setup(config)
        import uuid

        self.origin = uuid.uuid4().hex[:8]

    def state_dict(self):
        return {"origin": self.origin}

    def load_state_dict(self, state):
        self.origin = state["origin"]


class RaisingOperator(LinearOperator):
    """Raises KeyError in train_batch at ``self.fail_step`` (a global step) on ``self.fail_ranks``;
    both are set by the test with apply_all_operators, so a rolled-back trainer trains on."""

    fail_step = None
    fail_ranks = ()

    def train_batch(self, batch, batch_info):
        if self.world_rank in self.fail_ranks and batch_info["global_step"] == self.fail_step:
            raise KeyError(f"missing-key at step {self.fail_step}")
        return super().train_batch(batch, batch_info)


class KeywordEpochOperator(LinearOperator):
    """A Ray 1.12-style train_epoch override: reports the keywords and info it was given."""

    def train_epoch(self, iterator, info=None, num_steps=None, epoch_idx=0):
        batches = sum(1 for _ in iterator)
        return {"batches": batches, "num_steps": -1 if num_steps is None else num_steps,
                "epoch_idx": epoch_idx, "info_keys": sorted(info)}

    def validate(self, val_iterator, info=None):
        targets = [float(y) for _, ys in val_iterator for y in ys.flatten()]
        return {"first": targets[0], "last": targets[-1], "count": len(targets),
                "num_samples": len(targets), "info_num_steps": info["__num_steps__"] or 0}


class InterruptedOperator(RaisingOperator):
    """Raises KeyboardInterrupt (as a Ctrl-C in the driver would) instead of KeyError."""

    def train_batch(self, batch, batch_info):
        try:
            return super().train_batch(batch, batch_info)
        except KeyError:
            raise KeyboardInterrupt from None


class WrongReturnOperator(LinearOperator):
    """``train(info={"bad_return": X})`` makes ``train_batch`` step, then return X from its
    second batch on; ``validate(info=...)`` does the same in ``validate_batch``."""

    def train_batch(self, batch, batch_info):
        metrics = super().train_batch(batch, batch_info)
        if "bad_return" in batch_info and batch_info["batch_idx"] >= 1:
            return batch_info["bad_return"]
        return metrics

    def validate_batch(self, batch, batch_info):
        metrics = super().validate_batch(batch, batch_info)
        return batch_info["bad_return"] if "bad_return" in batch_info else metrics


class WideOperator(RaisingOperator):
    """RaisingOperator with a wide hidden layer and Adam: about 35 MB of state per rank,
    above the size whose between-call commits go to the driver's slabs."""

    def setup(self, config):
        torch.manual_seed(config.get("seed", 0))
        width = config.get("width", 1700)
        model = nn.Sequential(nn.Linear(1, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                              nn.Linear(width, 1))
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        batch = config.get(BATCH_SIZE, 32)
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=optimizer, criterion=nn.MSELoss())
        self.register_data(
            train_loader=DataLoader(LinearDataset(2, 5, size=config.get("data_size", 256)),
                                    batch_size=batch),
            validation_loader=DataLoader(LinearDataset(2, 5, size=64), batch_size=batch))
        record_pid(config, self.world_rank)


class DyingWideOperator(WideOperator):
    """WideOperator whose rank ``die_rank`` SIGKILLs itself at global step ``die_step`` (both
    set by the test with apply_all_operators; a newcomer in its place has neither)."""

    die_step, die_rank = None, 1

    def train_batch(self, batch, batch_info):
        if self.world_rank == self.die_rank and batch_info["global_step"] == self.die_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().train_batch(batch, batch_info)
