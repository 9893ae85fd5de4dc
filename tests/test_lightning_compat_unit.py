"""The Lightning adapter's pure parts added for modules as users write them, without Ray: how
from_ptl gets a module (class with arguments, instance, factory, the legacy rule) and the errors
for constructors that do not fit; Lightning 1.x's hook signatures mapped (fake 1.x modules: the
real 1.x runs in tests/test_lightning_v1.py); the version refusal; Lightning's on_step/on_epoch
key names; validate() without validation_step."""
import functools
import sys

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning",
                         reason="Lightning tests need pytorch_lightning (pip install raysgd[lightning])")

from raysgd.config import RankInfo, WorkerSettings  # noqa: E402
from raysgd.errors import ConfigError  # noqa: E402
from raysgd.lightning import compat, v1  # noqa: E402
from raysgd.lightning.logs import LogCollector, LoggedMeters  # noqa: E402
from raysgd.lightning.source import source_of  # noqa: E402
from raysgd.torch import TrainingOperator  # noqa: E402
from raysgd.worker.runner import WorkerRunner  # noqa: E402


def data(n=32):
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
    return TensorDataset(x, x.sum(1, keepdim=True))


def runner_for(operator_cls, config=None):
    runner = WorkerRunner(operator_cls, config or {}, WorkerSettings(), RankInfo())
    runner.setup_operator()
    return runner


class Base(pl.LightningModule):
    """Trains a small net on data(); subclasses differ in their constructors."""

    def train_dataloader(self):
        return DataLoader(data(), batch_size=8)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=getattr(self, "lr", 0.1))


class Vocab(Base):
    def __init__(self, vocab_size):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, 3)
        self.net = nn.Linear(3, 1)


class Wrapped(Base):
    def __init__(self, model: nn.Module, lr):
        super().__init__()
        self.net, self.lr = model, lr


class Template(Base):
    """The Hydra template's style: partials for the optimizer and scheduler."""

    def __init__(self, net, optimizer: functools.partial, scheduler: functools.partial,
                 compile: bool):
        super().__init__()
        self.net, self.make_optimizer, self.make_scheduler = net, optimizer, scheduler

    def configure_optimizers(self):
        opt = self.make_optimizer(params=self.parameters())
        return {"optimizer": opt, "lr_scheduler": self.make_scheduler(optimizer=opt)}


class Legacy(Base):
    def __init__(self, config):
        super().__init__()
        self.config, self.net = config, nn.Linear(3, 1)


# ---------------------------------------------------------------- how the module is built
def test_each_constructor_style_builds_its_own_copy_on_the_worker():
    net = nn.Linear(3, 1)
    template = dict(net=net, optimizer=functools.partial(torch.optim.SGD, lr=0.1),
                    scheduler=functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1),
                    compile=False)
    operators = {
        "vocab": TrainingOperator.from_ptl(Vocab, module_args=(10,)),
        "wrapped": TrainingOperator.from_ptl(Wrapped, module_kwargs={"model": net, "lr": 0.5}),
        "template": TrainingOperator.from_ptl(Template, module_kwargs=template),
        "instance": TrainingOperator.from_ptl(Wrapped(net, lr=0.5)),
        "factory": TrainingOperator.from_ptl(  # builds its objects itself, like a creator
            lambda config: Wrapped(nn.Linear(3, 1), lr=config["lr"])),
        "legacy": TrainingOperator.from_ptl(Legacy),
    }
    before = net.weight.detach().clone()
    for name, operator in operators.items():
        runner = runner_for(operator, {"lr": 0.25})
        module = runner.operator.get_model()
        runner.train_epoch()
        assert module.net is not net, name  # every worker trains a copy
    assert torch.equal(net.weight, before)  # the driver's objects were never trained
    assert operators["vocab"]._lightning_module_cls is Vocab
    assert runner_for(operators["factory"], {"lr": 0.25}).operator.get_model().lr == 0.25
    assert runner.operator.get_model().config == {"lr": 0.25}  # legacy: Module(config)


def test_arguments_that_do_not_fit_are_refused_on_the_driver_naming_signature_and_call():
    with pytest.raises(ConfigError, match=r"Wrapped\(model: torch.nn.modules.module.Module, lr\) "
                                          r"cannot be called with module_args=\(\).*'lr'"):
        TrainingOperator.from_ptl(Wrapped, module_kwargs={"model": nn.Linear(3, 1)})
    with pytest.raises(ConfigError, match=r"Template\(net, optimizer.*needs net, optimizer, "
                                          r"scheduler, compile.*Template\(config\).*module_args"):
        TrainingOperator.from_ptl(Template)  # the class alone: the legacy rule cannot fit
    with pytest.raises(ConfigError, match=r"Wrapped.*needs model, lr"):
        TrainingOperator.from_ptl(Wrapped)
    with pytest.raises(ConfigError, match="factory.*cannot be called with"):
        TrainingOperator.from_ptl(lambda: Legacy({}))  # a factory gets the config
    with pytest.raises(ConfigError, match="apply to a LightningModule class only"):
        TrainingOperator.from_ptl(Legacy({}), module_args=(1,))
    with pytest.raises(ConfigError, match="tuple of positional arguments"):
        TrainingOperator.from_ptl(Vocab, module_args=10)


def test_the_legacy_rule_says_what_it_passed_when_its_guess_fails_on_the_worker():
    # One unannotated parameter: raysgd cannot tell on the driver that it is not the config.
    operator = TrainingOperator.from_ptl(Vocab)
    with pytest.raises(ConfigError, match=r"Vocab\(vocab_size\) as Vocab\(config\) failed: "
                                          r"TypeError.*config dict \(\{'x': 1\}\) as "
                                          r"'vocab_size'.*module_args") as error:
        runner_for(operator, {"x": 1})
    assert isinstance(error.value.__cause__, TypeError)  # the constructor's own error

    class Annotated(Vocab):
        def __init__(self, vocab_size: int):
            super().__init__(vocab_size)

    with pytest.raises(ConfigError, match=r"Annotated\(vocab_size: int\) needs vocab_size"):
        TrainingOperator.from_ptl(Annotated)  # an int never takes the dict: said on the driver


def test_a_factory_must_return_a_lightning_module():
    operator = TrainingOperator.from_ptl(lambda config: nn.Linear(3, 1))
    with pytest.raises(ConfigError, match="returned Linear, not a LightningModule"):
        runner_for(operator)
    assert source_of(Legacy).legacy and not source_of(Vocab, (3,)).legacy


# ---------------------------------------------------------------------- Lightning versions
def test_lightning_older_than_1_6_is_refused_naming_the_version(monkeypatch):
    monkeypatch.setattr(sys.modules["pytorch_lightning"], "__version__", "1.5.10")
    with pytest.raises(ConfigError, match=r"supports Lightning 2.x and 1.6-1.9; "
                                          r"pytorch_lightning 1.5.10 is installed"):
        TrainingOperator.from_ptl(Legacy)
    monkeypatch.setattr(sys.modules["pytorch_lightning"], "__version__", "1.9.0rc0")
    assert compat.check_version(pl.LightningModule) == 1
    monkeypatch.setattr(sys.modules["pytorch_lightning"], "__version__", "2.0.0")
    assert compat.check_version(pl.LightningModule) == 2


class FakeV1:
    """The 1.x signatures of the hooks raysgd adapts (pure: no Lightning behind them)."""

    def __init__(self):
        self.calls = []

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_idx, optimizer_closure,
                       on_tpu, using_native_amp, using_lbfgs):
        self.calls.append(("step", optimizer_idx, on_tpu, using_native_amp, using_lbfgs))
        optimizer_closure()

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer, optimizer_idx):
        self.calls.append(("zero", optimizer_idx))

    def on_before_optimizer_step(self, optimizer, optimizer_idx):
        self.calls.append(("before", optimizer_idx))

    def configure_gradient_clipping(self, optimizer, optimizer_idx, gradient_clip_val=None,
                                    gradient_clip_algorithm=None):
        self.calls.append(("clip", optimizer_idx, gradient_clip_val, gradient_clip_algorithm))

    def lr_scheduler_step(self, scheduler, optimizer_idx, metric):
        self.calls.append(("sched", optimizer_idx, metric))

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx):
        self.calls.append(("val_start", dataloader_idx))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx):
        self.calls.append(("val_end", dataloader_idx))


class FakeV19(FakeV1):
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_idx=0,
                       optimizer_closure=None, on_tpu=False, using_lbfgs=False):  # 1.9's
        self.calls.append(("step19", optimizer_idx, using_lbfgs))


def test_1x_hooks_are_called_with_their_1x_arguments():
    module, lbfgs = FakeV1(), torch.optim.LBFGS(nn.Linear(1, 1).parameters())
    hooks = v1.adapters(module, using_native_amp=True)
    closure_ran = []
    hooks["optimizer_step"](0, 3, lbfgs, lambda: closure_ran.append(1))
    hooks["optimizer_zero_grad"](0, 3, lbfgs)
    hooks["on_before_optimizer_step"](lbfgs)
    hooks["configure_gradient_clipping"](lbfgs, 1.0, "norm")
    hooks["lr_scheduler_step"]("sched", 0.5)
    hooks["on_validation_batch_start"]("batch", 0)
    hooks["on_validation_batch_end"]({}, "batch", 0)
    assert module.calls == [("step", 0, False, True, True), ("zero", 0), ("before", 0),
                            ("clip", 0, 1.0, "norm"), ("sched", 0, 0.5), ("val_start", 0),
                            ("val_end", 0)] and closure_ran == [1]
    newer = FakeV19()
    v1.adapters(newer, using_native_amp=False)["optimizer_step"](0, 0, lbfgs, None)
    assert newer.calls == [("step19", 0, True)]  # no using_native_amp for a hook without it


def test_step_end_hooks_and_the_epoch_outputs_1x_hands_on():
    class StepEnd(Legacy):
        def training_step_end(self, output):
            return {"loss": output, "tag": 1}

        def validation_step_end(self, output):
            return None  # None keeps the step's own output, as 1.x did

        def validation_step(self, batch, batch_idx):
            return torch.tensor(2.0)

    module = StepEnd({})
    wrappers = v1.step_end_wrappers(module)
    batch = next(iter(module.train_dataloader()))
    assert sorted(wrappers["training_step"](batch, 0)) == ["loss", "tag"]
    assert wrappers["validation_step"](batch, 0) == 2.0
    assert v1.step_end_wrappers(Legacy({})) == {}  # nothing overridden: nothing wrapped
    loss = torch.tensor(1.0, requires_grad=True) * 2
    assert not v1.training_entry(loss)["loss"].requires_grad  # detached, as 1.x stored it
    assert v1.training_entry({"loss": loss, "hiddens": 1, "x": 3}).keys() == {"loss", "x"}
    assert v1.training_entry({}) is None and v1.training_entry(None) is None
    collected = []
    for output in (loss, None, {"loss": loss}, {}):
        v1.EpochOutputs.add(collected, output, training=True)
    assert len(collected) == 2  # None and an empty dict are dropped


def test_epoch_end_hooks_run_once_per_call_with_outputs_and_what_they_return():
    class EpochEnds(Legacy):
        seen = []

        def training_epoch_end(self, outputs):
            self.seen.append(("train", len(outputs), float(outputs[0]["loss"] > 0)))
            self.log("from_epoch_end", 1.0)

        def validation_step(self, batch, batch_idx):
            return {"n": len(batch[0])}

        def val_dataloader(self):
            return DataLoader(data(), batch_size=16)

        def validation_epoch_end(self, outputs):
            self.seen.append(("val", [o["n"] for o in outputs]))
            return self.returns  # Lightning 1.6+ wants None; Ray 1.12 reported a dict or tensor

    runner = runner_for(TrainingOperator.from_ptl(EpochEnds))
    assert runner.train_epoch()["from_epoch_end"] == 1.0
    assert EpochEnds.seen == [("train", 4, 1.0)]  # 32 samples, batches of 8
    module = runner.operator.get_model()
    module.returns = {"val_total": torch.tensor(32.0), "note": "text"}
    validated = runner.validate()
    assert validated["val_total"] == 32.0  # its one-number entries, as 1.12 read them
    assert type(validated["val_total"]) is float
    assert EpochEnds.seen[-1] == ("val", [16, 16])
    module.returns = torch.tensor(0.5)
    assert runner.validate()["val_loss"] == 0.5
    module.returns = [1]
    with pytest.raises(ConfigError, match="validation_epoch_end returned list; it must return "
                                          "None.*Ray 1.12.*a dict of metrics"):
        runner.validate()


# ------------------------------------------------------------- on_step / on_epoch key names
def test_forked_values_get_lightnings_step_and_epoch_names():
    phase = ["train"]
    logs, meters = LogCollector(lambda: True, lambda: phase[0]), LoggedMeters()
    logs.begin_epoch()
    for value in (1.0, 3.0):
        logs.begin_batch()
        logs.log("both", value, on_step=True, on_epoch=True)
        logs.log("epoch_default_step", value, on_epoch=True)  # training: on_step defaults True
        logs.log("plain", value)
        logs.log("epoch_only", value, on_step=False, on_epoch=True)
        logged = logs.end_batch()
        meters.add_logged(logged, num_samples=1)
    assert logged.step_values()["both_step"] == 3.0 and "plain_step" not in logged.step_values()
    summary = meters.summary()
    for name in ("both", "epoch_default_step"):
        assert (summary[name], summary[name + "_epoch"], summary[name + "_step"]) == (2.0, 2.0, 3.0)
    assert not {"plain_step", "plain_epoch", "epoch_only_step", "epoch_only_epoch"} & set(summary)
    phase[0] = "validate"  # validation: on_epoch defaults True, so on_step=True forks
    logs.begin_epoch()
    logs.begin_batch()
    logs.log("val_loss", 1.0, on_step=True)
    logs.log("val_plain", 1.0)
    assert logs.end_batch().forked == {"val_loss"}


def test_1x_log_keywords_are_accepted_and_others_refused():
    logs = LogCollector(lambda: True)
    logs.begin_epoch()
    logs.begin_batch()
    logs.log("a", 1.0, sync_dist_op="mean", tbptt_reduce_fx="mean", tbptt_pad_token=0)
    logs.log_dict({"b": 2.0}, sync_dist_op="mean")
    with pytest.warns(RuntimeWarning, match="averages logged values"):
        logs.log("c", 1.0, sync_dist_op="sum")
    with pytest.raises(TypeError, match="unexpected keyword arguments.*not_a_keyword"):
        logs.log("d", 1.0, not_a_keyword=1)
    assert logs.end_batch().values == {"a": 1.0, "b": 2.0, "c": 1.0}


def test_a_plateau_scheduler_can_monitor_an_epoch_key():
    class Plateau(Legacy):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", F.mse_loss(self.net(batch[0]), batch[1]), on_step=True)

        def val_dataloader(self):
            return DataLoader(data(), batch_size=16)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", patience=0)
            return {"optimizer": opt, "lr_scheduler": sched, "monitor": "val_loss_epoch"}

    runner = runner_for(TrainingOperator.from_ptl(Plateau))
    for _ in range(2):
        runner.train_epoch()
        assert {"val_loss", "val_loss_epoch", "val_loss_step"} <= set(runner.validate())
    assert runner.operator.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01)


# --------------------------------------------------------------- validate() without a step
def test_validate_without_validation_step_says_so_in_lightnings_terms():
    class LoaderOnly(Legacy):
        def val_dataloader(self):
            return DataLoader(data(), batch_size=16)

    with pytest.warns(RuntimeWarning, match="has a validation loader but no validation_step"):
        runner = runner_for(TrainingOperator.from_ptl(LoaderOnly))
    assert runner.operator.validation_loader is None  # the base class's step is never run
    with pytest.raises(ConfigError, match=r"No validation_step\(\) method defined to run "
                                          r"validate\(\).*LoaderOnly"):
        runner.validate()

    class StepOnly(Legacy):
        def validation_step(self, batch, batch_idx):
            return None

    with pytest.raises(ConfigError, match="StepOnly defines validation_step but no validation "
                                          "data.*val_dataloader"):
        runner_for(TrainingOperator.from_ptl(StepOnly)).validate()


def test_a_commit_copies_1x_step_outputs_still_on_the_graph():
    """1.x keeps a step's extra outputs as returned (on the autograd graph); an in-epoch
    commit deep-copies the meters, which must not fail on them (deepcopy refuses non-leaf
    tensors) and must not alias or keep the graph."""
    import copy

    from raysgd.lightning.logs import LoggedMeters

    weight = torch.ones(2, requires_grad=True)
    preds = weight * 3  # not a leaf
    meters = LoggedMeters()
    meters.outputs = [{"loss": preds.sum().detach(), "preds": preds}]
    copied = copy.deepcopy(meters)
    assert copied.outputs[0]["preds"].grad_fn is None
    assert torch.equal(copied.outputs[0]["preds"], preds.detach())
    assert copied.outputs[0]["preds"].data_ptr() != preds.data_ptr()
    assert meters.outputs[0]["preds"] is preds  # the live list keeps what the step returned
