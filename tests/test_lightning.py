"""LightningModules on a real Ray with 2 gloo workers: automatic and manual optimization (raw
optimizers and all_gather included), logging averaged across workers, scheduler intervals, a
plateau scheduler on a validation metric kept by a rollback, bf16, save/load, recovery after a
kill, the example script, modules with constructor arguments (given as arguments, an instance
or a factory), forked on_step/on_epoch keys, and validate() without validation_step. The modules live here; Ray workers import this file by name."""
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning",
                         reason="Lightning tests need pytorch_lightning (pip install raysgd[lightning])")
torchmetrics = pytest.importorskip("torchmetrics")  # a dependency of pytorch_lightning

from operators_for_tests import read_step  # noqa: E402
from raysgd import TorchTrainer, TrainingOperator  # noqa: E402
from raysgd.errors import ConfigError  # noqa: E402
from raysgd.lightning.errors import TrainerAttributeError  # noqa: E402

pytestmark = pytest.mark.timeout(240)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUE_WEIGHTS = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def regression(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ TRUE_WEIGHTS + 0.1)


class Regressor(pl.LightningModule):
    """Automatic optimization; logs a rank-dependent value, the lr, and an epoch-end value."""

    def __init__(self, config):
        super().__init__()
        torch.manual_seed(0)
        self.config = config
        self.net = nn.Linear(4, 1)
        self.token = int(torch.randint(1 << 30, ()).item()) + os.getpid()  # differs per process

    def forward(self, x):
        return self.net(x)

    def setup(self, stage):
        self.data = regression()
        pid_dir = self.config.get("pid_dir")
        if pid_dir:  # lets a test kill this worker
            with open(os.path.join(pid_dir, f"rank{self.global_rank}"), "w") as handle:
                handle.write(str(os.getpid()))

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=64)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt,
                "lr_scheduler": {"scheduler": sched, "interval": self.config["interval"]}}

    def training_step(self, batch, batch_idx):
        time.sleep(self.config.get("sleep_s", 0))
        if self.config.get("pid_dir") and self.global_rank == 0:
            with open(os.path.join(self.config["pid_dir"], "step"), "w") as handle:
                handle.write(str(self.global_step))
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("rank_value", float(self.global_rank))
        self.log("lr", self.optimizers().param_groups[0]["lr"])
        return loss

    def on_train_epoch_end(self):
        self.log("epoch_end_value", 10.0 * self.global_rank + self.current_epoch)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_mse", F.mse_loss(self(x), y))

    def on_save_checkpoint(self, checkpoint):
        checkpoint["token"] = self.token

    def on_load_checkpoint(self, checkpoint):
        self.token = checkpoint["token"]


class Gan(pl.LightningModule):
    """Manual optimization with two optimizers, toggling, clipping and a user-stepped scheduler."""

    def __init__(self, config):
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.generator = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))

    def setup(self, stage):
        g = torch.Generator().manual_seed(1)
        self.real = TensorDataset(torch.randn(512, 4, generator=g) * 0.5 + 2.0)
        self.noise = torch.Generator().manual_seed(self.global_rank)  # each rank its own z

    def train_dataloader(self):
        return DataLoader(self.real, batch_size=32, shuffle=True)

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=0.02, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=0.02, betas=(0.5, 0.999))
        return [opt_g, opt_d], [torch.optim.lr_scheduler.StepLR(opt_g, 1, gamma=0.9)]

    def training_step(self, batch, batch_idx):
        (real,) = batch
        opt_g, _ = self.optimizers(use_pl_optimizer=False)  # raw: its step() must average too
        _, opt_d = self.optimizers()
        valid, fake = torch.ones(real.size(0), 1), torch.zeros(real.size(0), 1)
        generated = self.generator(torch.randn(real.size(0), 2, generator=self.noise))
        with self.toggled_optimizer(opt_g):
            g_loss = F.binary_cross_entropy_with_logits(self.discriminator(generated), valid)
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
        with self.toggled_optimizer(opt_d):
            d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(real), valid)
                      + F.binary_cross_entropy_with_logits(
                          self.discriminator(generated.detach()), fake)) / 2
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            self.clip_gradients(opt_d, gradient_clip_val=1.0, gradient_clip_algorithm="norm")
            opt_d.step()
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss,
                       "distance": (generated.mean(0) - 2.0).abs().mean()})
        gathered = self.all_gather({"rank": torch.tensor(float(self.global_rank)), "one": 1})
        self.log_dict({"rank_sum": gathered["rank"].sum(), "ones": gathered["one"].sum()})

    def on_train_epoch_end(self):
        self.lr_schedulers().step()  # manual optimization: the user steps schedulers


class PlateauRegressor(Regressor):
    """ReduceLROnPlateau on a validation metric; a rank-zero-only torchmetrics value."""

    def __init__(self, config):
        super().__init__(config)
        self.mean_loss = torchmetrics.MeanMetric()  # compute() syncs across the workers

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": sched, "monitor": "val_mse"}

    def training_step(self, batch, batch_idx):
        if os.path.exists(self.config["fail_flag"]):
            raise ValueError("asked to fail")
        loss = super().training_step(batch, batch_idx)
        self.mean_loss.update(loss.detach())
        self.log("mean_loss", self.mean_loss, rank_zero_only=True)
        return loss


class TouchesStrategy(Regressor):
    def training_step(self, batch, batch_idx):
        return self.trainer.strategy.reduce(torch.tensor(1.0))


# Constructor styles of public LightningModules, which from_ptl(Module) alone cannot build.
class TokenClassifier(pl.LightningModule):
    """``__init__(self, vocab_size)``: tokens 0..vocab_size-1, label = token is even."""

    def __init__(self, vocab_size):
        super().__init__()
        torch.manual_seed(0)
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, 8)
        self.head = nn.Linear(8, 2)

    def train_dataloader(self):
        tokens = torch.arange(256) % self.vocab_size
        return DataLoader(TensorDataset(tokens, tokens % 2), batch_size=32, shuffle=True)

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        return F.cross_entropy(self.head(self.embed(tokens)), labels)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class WrapsModel(pl.LightningModule):
    """``__init__(self, model: nn.Module, lr)``, built on the driver or by a factory."""

    def __init__(self, model: nn.Module, lr):
        super().__init__()
        self.model, self.lr = model, lr

    def train_dataloader(self):
        return DataLoader(regression(), batch_size=32, shuffle=True)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class TemplateModule(pl.LightningModule):
    """The Hydra template's ``__init__(self, net, optimizer: partial, scheduler: partial,
    compile: bool)``; its plateau scheduler monitors the forked ``val/loss_epoch``."""

    def __init__(self, net, optimizer: functools.partial, scheduler: functools.partial,
                 compile: bool):
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net = net

    def train_dataloader(self):
        return DataLoader(regression(), batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(regression(seed=1), batch_size=64)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self.net(x), y)
        self.log("train/loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/loss", F.mse_loss(self.net(x), y), on_step=True, on_epoch=True)

    def configure_optimizers(self):
        optimizer = self.hparams.optimizer(params=self.parameters())
        scheduler = self.hparams.scheduler(optimizer=optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler,
                                                         "monitor": "val/loss_epoch"}}


class ValLoaderNoStep(Regressor):
    validation_step = pl.LightningModule.validation_step  # Lightning's (empty) one


def params(module):
    return [p.detach().clone() for p in module.parameters()]


def identical(first, second):
    return all(torch.equal(a, b) for a, b in zip(first, second))


def lrs(trainer):
    return trainer.apply_all_operators(lambda op: op.optimizers[0].param_groups[0]["lr"])


def test_automatic_optimization_logs_averaged_over_workers_and_step_interval(trainer_factory):
    trainer = trainer_factory(TrainingOperator.from_ptl(Regressor), config={"interval": "step"})
    first = trainer.train()  # 256 samples, 2 workers, batch 32: 4 steps per worker
    assert first["num_samples"] == 256 and first["batch_count"] == 4
    assert first["rank_value"] == 0.5  # rank 0 logs 0, rank 1 logs 1: averaged on the driver
    assert first["epoch_end_value"] == 5.0  # 10 * rank + current_epoch 0
    assert first["lr"] == pytest.approx(0.05 * (1 + 0.5 + 0.25 + 0.125) / 4)
    assert lrs(trainer) == [pytest.approx(0.05 / 16)] * 2  # one scheduler step per batch
    val = trainer.validate()
    second, val2 = trainer.train(), trainer.validate()
    assert second["epoch_end_value"] == 6.0
    assert second["train_loss"] < first["train_loss"] and val2["val_mse"] < val["val_mse"]
    weights = trainer.apply_all_operators(lambda op: params(op.get_model()))
    assert identical(*weights)  # DDP kept the ranks in step


def test_bf16_epoch_interval_without_ddp_and_get_model(trainer_factory):
    # wrap_ddp=False: each step averages the gradients itself (once, though clipping asks too).
    trainer = trainer_factory(TrainingOperator.from_ptl(Regressor), config={"interval": "epoch"},
                              use_fp16="bf16", wrap_ddp=False, clip_grad_norm=5.0)
    first = trainer.train()
    assert first["lr"] == 0.05 and lrs(trainer) == [0.025, 0.025]  # stepped once, at the end
    second = trainer.train()
    assert second["lr"] == 0.025 and second["train_loss"] < first["train_loss"]
    model = trainer.get_model()
    assert isinstance(model, Regressor) and list(model.state_dict()) == ["net.weight", "net.bias"]
    rank0, rank1 = trainer.apply_all_operators(lambda op: params(op.get_model()))
    assert identical(params(model), rank0) and identical(rank0, rank1)
    assert not identical(params(model), params(Regressor({})))  # trained, not the initial weights


def test_manual_optimization_gan_with_two_optimizers(trainer_factory):
    trainer = trainer_factory(TrainingOperator.from_ptl(Gan))
    results = [trainer.train() for _ in range(4)]
    assert {"g_loss", "d_loss", "distance", "num_samples"} <= results[0].keys()
    assert results[0]["rank_sum"] == 1.0 and results[0]["ones"] == 2  # gathered from ranks 0, 1
    assert results[-1]["distance"] < 0.8 * results[0]["distance"]  # the generator learns
    g_lr, d_lr = trainer.apply_all_operators(
        lambda op: [opt.param_groups[0]["lr"] for opt in op.optimizers])[0]
    assert g_lr == pytest.approx(0.02 * 0.9 ** 4) and d_lr == 0.02  # only the user's steps
    weights = trainer.apply_all_operators(lambda op: params(op.get_model()))
    assert identical(*weights)  # each opt.step() averaged its gradients over the ranks


def test_save_and_load_carry_weights_schedulers_and_checkpoint_hooks(trainer_factory, tmp_path):
    operator = TrainingOperator.from_ptl(Regressor)
    first = trainer_factory(operator, config={"interval": "epoch"})
    first.train()
    path = first.save(str(tmp_path / "lightning.ckpt"))
    tokens = first.apply_all_operators(lambda op: op.get_model().token)
    assert tokens[0] != tokens[1]  # each worker drew its own
    weights = params(first.get_model())
    second = trainer_factory(operator, config={"interval": "epoch"})
    second.load(path)
    assert second.apply_all_operators(lambda op: op.get_model().token) == [tokens[0]] * 2
    assert identical(params(second.get_model()), weights)
    assert lrs(second) == [0.025, 0.025]
    assert second.apply_all_operators(lambda op: op.current_epoch) == [1, 1]
    assert second.train()["lr"] == 0.025


def test_plateau_on_a_validation_metric_and_its_step_survives_a_rollback(trainer_factory,
                                                                         tmp_path):
    flag = tmp_path / "fail"
    trainer = trainer_factory(TrainingOperator.from_ptl(PlateauRegressor),
                              config={"fail_flag": str(flag)})
    first = trainer.train()
    # rank 0 alone reports it, but both ranks computed it (its sync would hang otherwise)
    assert first["mean_loss"] == pytest.approx(first["train_loss"], rel=1e-4)
    trainer.validate()  # the plateau scheduler's first value
    assert trainer.train()["lr"] == 0.05
    trainer.validate()  # val_mse fell, which mode="max" reads as no improvement: lr halved
    flag.touch()  # (no apply_all_operators here: it would commit)
    with pytest.raises(ValueError, match="asked to fail"):
        trainer.train()  # a user error: every rank rolls back to the last commit
    flag.unlink()
    assert trainer.train()["lr"] == 0.025  # validate() committed its scheduler step
    assert lrs(trainer) == [0.025, 0.025]


def test_unsupported_trainer_attribute_names_itself():
    trainer = TorchTrainer(training_operator_cls=TrainingOperator.from_ptl(TouchesStrategy),
                           config={"interval": "step"}, num_workers=1, use_local=True)
    try:
        with pytest.raises(TrainerAttributeError, match="self.trainer.strategy.*all_gather"):
            trainer.train()
    finally:
        trainer.shutdown()


def test_modules_with_constructor_arguments_instances_and_factories(trainer_factory):
    net = nn.Linear(4, 1)
    driver_weights = params(net)
    instance = WrapsModel(net, lr=0.05)
    operators = [
        TrainingOperator.from_ptl(TokenClassifier, module_args=(16,)),
        TrainingOperator.from_ptl(instance),  # shipped pickled: each worker trains a copy
        TrainingOperator.from_ptl(lambda config: WrapsModel(nn.Linear(4, 1), lr=config["lr"])),
    ]
    for operator in operators:
        trainer = trainer_factory(operator, config={"lr": 0.05})
        first, second = trainer.train(), trainer.train()
        assert second["train_loss"] < first["train_loss"], operator.__name__
        assert identical(*trainer.apply_all_operators(lambda op: params(op.get_model())))
        trainer.shutdown()
    assert identical(params(net), driver_weights)  # the driver's instance was not trained
    # The class alone: raysgd guesses TokenClassifier(config); the worker says what it passed.
    with pytest.raises(ConfigError, match=r"TokenClassifier\(vocab_size\) as "
                                          r"TokenClassifier\(config\) failed.*as 'vocab_size'"):
        trainer_factory(TrainingOperator.from_ptl(TokenClassifier), config={"lr": 0.05})


def test_partials_in_the_constructor_and_a_plateau_on_a_forked_epoch_key(trainer_factory):
    operator = TrainingOperator.from_ptl(TemplateModule, module_kwargs=dict(
        net=nn.Linear(4, 1), optimizer=functools.partial(torch.optim.SGD, lr=0.05),
        scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="max",
                                    factor=0.5, patience=0), compile=False))
    trainer = trainer_factory(operator)
    result = trainer.train()
    assert result["train/loss_epoch"] == result["train/loss"]  # the call's average
    assert result["train/loss_step"] == result["last_train/loss"]  # its last batch
    first = trainer.validate()
    assert {"val/loss", "val/loss_epoch", "val/loss_step"} <= set(first)
    trainer.train()
    assert trainer.validate()["val/loss_epoch"] < first["val/loss_epoch"]
    assert lrs(trainer) == [0.025, 0.025]  # mode="max": the fall read as no improvement


def test_validate_without_validation_step_is_refused_in_lightnings_terms(trainer_factory):
    trainer = trainer_factory(TrainingOperator.from_ptl(ValLoaderNoStep),
                              config={"interval": "epoch"})
    with pytest.raises(ConfigError, match=r"No validation_step\(\) method defined to run "
                                          r"validate\(\).*ValLoaderNoStep"):
        trainer.validate()
    assert trainer.train()["num_samples"] == 256  # still usable


@pytest.mark.slow
def test_a_killed_worker_is_recovered_to_the_same_weights(trainer_factory, tmp_path):
    def run(**config):
        trainer = trainer_factory(TrainingOperator.from_ptl(Regressor), checkpoint_every_n_steps=2,
                                  config={"interval": "step", **config})
        if "pid_dir" in config:  # 4 steps an epoch: kill rank 1 mid second epoch
            threading.Thread(target=kill_rank_1_at, args=(config["pid_dir"], 5),
                             daemon=True).start()
        return trainer, [trainer.train() for _ in range(3)]

    reference, expected = run()
    reference_params, reference_lrs = params(reference.get_model()), lrs(reference)
    reference.shutdown()  # its workers wait in the pool: the faulted run starts on them
    faulted, got = run(pid_dir=str(tmp_path), sleep_s=0.05)
    assert faulted.recovery_stats.recoveries == 1
    assert [r["epoch"] for r in got] == [r["epoch"] for r in expected]
    assert identical(params(faulted.get_model()), reference_params)
    assert lrs(faulted) == reference_lrs
    tokens = faulted.apply_all_operators(lambda op: op.get_model().token)
    assert tokens[0] == tokens[1]  # the new worker got rank 0's checkpoint-hook state


def kill_rank_1_at(pid_dir, step):
    deadline = time.monotonic() + 60
    while read_step(pid_dir) < step and time.monotonic() < deadline:
        time.sleep(0.005)
    with open(os.path.join(pid_dir, "rank1")) as handle:
        os.kill(int(handle.read()), signal.SIGKILL)


@pytest.mark.slow
def test_lightning_example_smoke_test():
    out = subprocess.run([sys.executable, "examples/lightning_mnist.py", "--smoke-test"], cwd=ROOT,
                         capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-3000:]
    accuracies = [float(v) for v in re.findall(r"validation accuracy: ([\d.]+)", out.stdout)]
    assert len(accuracies) == 2 and min(accuracies) > 0.5, out.stdout
