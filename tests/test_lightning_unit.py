"""The Lightning adapter without Ray: configure_optimizers parsing, scheduler timing, logging,
the trainer stub, driver-side checks, and the operator driven in-process at world size 1."""
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning",
                         reason="Lightning tests need pytorch_lightning (pip install raysgd[lightning])")

from raysgd.config import RankInfo, WorkerSettings  # noqa: E402
from raysgd.errors import ConfigError  # noqa: E402
from raysgd.lightning import LightningOperator, building  # noqa: E402
from raysgd.lightning.errors import NotALightningModuleError, TrainerAttributeError  # noqa: E402
from raysgd.lightning.logs import LogCollector  # noqa: E402
from raysgd.lightning.optim_config import SchedulerSpec, parse_optimizers  # noqa: E402
from raysgd.lightning.schedules import SchedulerStepper  # noqa: E402
from raysgd.lightning.trainer_stub import TrainerStub  # noqa: E402
from raysgd.runner import WorkerRunner  # noqa: E402
from raysgd.torch import TrainingOperator  # noqa: E402


def sgd(lr=0.1):
    return torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=lr)


# --------------------------------------------------------------- configure_optimizers forms
def test_every_documented_configure_optimizers_form():
    opt, opt2 = sgd(), sgd()
    step = torch.optim.lr_scheduler.StepLR(opt, 1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    assert parse_optimizers(opt) == ([opt], [])
    assert parse_optimizers([opt2, opt], automatic=False) == ([opt2, opt], [])
    assert parse_optimizers((opt,)) == ([opt], [])
    assert parse_optimizers(([opt], [step])) == ([opt], [SchedulerSpec(step)])
    assert parse_optimizers(([opt], step)) == ([opt], [SchedulerSpec(step)])
    assert parse_optimizers({"optimizer": opt}) == ([opt], [])
    assert parse_optimizers({"optimizer": opt, "lr_scheduler": step})[1] == [SchedulerSpec(step)]
    _, specs = parse_optimizers({"optimizer": opt, "lr_scheduler": {
        "scheduler": step, "interval": "step", "frequency": 3, "name": "warm"}})
    assert specs == [SchedulerSpec(step, name="warm", interval="step", frequency=3)]
    _, specs = parse_optimizers({"optimizer": opt, "lr_scheduler": plateau, "monitor": "val_loss"})
    assert specs == [SchedulerSpec(plateau, reduce_on_plateau=True, monitor="val_loss")]
    step2 = torch.optim.lr_scheduler.StepLR(opt2, 1)
    optimizers, specs = parse_optimizers(
        [{"optimizer": opt, "lr_scheduler": {"scheduler": step, "interval": "step"}},
         {"optimizer": opt2, "lr_scheduler": step2}], automatic=False)
    assert optimizers == [opt, opt2]
    assert specs == [SchedulerSpec(step, interval="step"), SchedulerSpec(step2)]


def test_manual_optimization_drops_plateau_keys_with_a_warning():
    opt = sgd()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.warns(RuntimeWarning, match="ignored with manual optimization"):
        _, specs = parse_optimizers({"optimizer": opt, "lr_scheduler": {
            "scheduler": plateau, "monitor": "loss"}}, automatic=False)
    assert specs == [SchedulerSpec(plateau)]  # the user steps it; raysgd never does


@pytest.mark.parametrize("conf, match", [
    (None, "returned None"),
    ("adam", "not a form Lightning 2.x documents"),
    ([], "no optimizer"),
    ({"lr_scheduler": None}, "without 'optimizer'"),
    ({"optimizer": "sgd"}, "must be a torch optimizer"),
])
def test_bad_configure_optimizers_results_say_what_to_return(conf, match):
    with pytest.raises(ConfigError, match=match):
        parse_optimizers(conf)


def test_bad_scheduler_settings_are_refused():
    opt = sgd()
    step = torch.optim.lr_scheduler.StepLR(opt, 1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    with pytest.raises(ConfigError, match="'epoch' or 'step'"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": step, "interval": "batch"}})
    with pytest.raises(ConfigError, match="integer >= 1"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": step, "frequency": 0}})
    with pytest.raises(ConfigError, match="needs the metric it watches"):
        parse_optimizers(([opt], [plateau]))
    with pytest.raises(ConfigError, match="needs the key 'scheduler'"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"interval": "step"}})
    with pytest.raises(ConfigError, match="did not return"):
        parse_optimizers(([sgd()], [step]))
    with pytest.raises(ConfigError, match="only with manual optimization"):
        parse_optimizers([opt, sgd()])
    with pytest.warns(RuntimeWarning, match="unsupported keys"):
        parse_optimizers({"optimizer": opt, "frequency": 2})


# --------------------------------------------------------------------- scheduler timing
class Recorder:
    def __init__(self):
        self.calls = []

    def step(self, scheduler, metric):
        self.calls.append((scheduler, metric))


def stepper(*specs, average=lambda value, weight: value, enabled=True):
    recorder = Recorder()
    return SchedulerStepper(list(specs), recorder.step, average, enabled), recorder


def test_step_and_epoch_intervals_follow_their_frequency():
    each_step, every_2nd_epoch = object(), object()
    steps, recorder = stepper(SchedulerSpec(each_step, interval="step"),
                              SchedulerSpec(every_2nd_epoch, frequency=2))
    for done in range(1, 4):
        steps.after_optimizer_step(done, {})
    assert [c[0] for c in recorder.calls] == [each_step] * 3
    steps.after_train({}, can_validate=False)
    steps.after_train({}, can_validate=False)
    assert [c[0] for c in recorder.calls[3:]] == [every_2nd_epoch]
    assert steps.state_dict() == {"epochs_done": 2, "pending": []}


def test_plateau_uses_the_train_metric_or_waits_for_validate():
    on_train, on_val = object(), object()
    steps, recorder = stepper(SchedulerSpec(on_train, reduce_on_plateau=True, monitor="loss"),
                              SchedulerSpec(on_val, reduce_on_plateau=True, monitor="val_loss"))
    steps.after_train({"loss": 2.0, "num_samples": 8}, can_validate=True)
    assert recorder.calls == [(on_train, 2.0)] and steps.pending == [1]
    steps.after_validate({"val_loss": 0.5})
    assert recorder.calls[-1] == (on_val, 0.5) and steps.pending == []
    steps.after_validate({"val_loss": 0.1})  # once per epoch, not per validate()
    assert len(recorder.calls) == 2


def test_plateau_steps_with_the_workers_average():
    spec = SchedulerSpec(object(), reduce_on_plateau=True, monitor="loss")
    seen = []

    def average(value, weight):
        seen.append((value, weight))
        return 7.0  # what the all-reduce returned

    steps, recorder = stepper(spec, average=average)
    steps.after_train({"loss": 1.0, "num_samples": 4}, can_validate=False)
    assert seen == [(1.0, 4.0)] and recorder.calls == [(spec.scheduler, 7.0)]


def test_a_missing_monitor_raises_or_warns_when_not_strict():
    strict = SchedulerSpec(object(), reduce_on_plateau=True, monitor="val_acc")
    steps, _ = stepper(strict)
    with pytest.raises(ConfigError, match="'val_acc'.*available metrics: \\['loss'\\]"):
        steps.after_train({"loss": 1.0, "last_loss": 1.0}, can_validate=False)
    lenient = SchedulerSpec(object(), reduce_on_plateau=True, monitor="val_acc", strict=False)
    steps, recorder = stepper(lenient)
    with pytest.warns(RuntimeWarning, match="skipping"):
        steps.after_train({"loss": 1.0}, can_validate=False)
    assert recorder.calls == []


def test_manual_optimization_never_steps_schedulers():
    steps, recorder = stepper(SchedulerSpec(object(), interval="step"), SchedulerSpec(object()),
                              enabled=False)
    steps.after_optimizer_step(1, {})
    steps.after_train({}, can_validate=False)
    assert recorder.calls == [] and steps.epochs_done == 1


# --------------------------------------------------------------------------- logging
def test_logged_values_are_averaged_per_batch_and_checked():
    logs = LogCollector(lambda: False)
    logs.begin_epoch()
    logs.begin_batch()
    logs.log("a", torch.tensor(1.0))
    logs.log("a", 3)  # twice in a batch: the mean
    logs.log_dict({"b": torch.tensor([2.0])}, batch_size=5)
    logs.log("zero_only", 9.0, rank_zero_only=True)  # this rank is not rank 0
    assert logs.end_batch() == ({"a": 2.0, "b": 2.0}, 5)
    logs.log("epoch_value", 4.0)
    assert logs.end_epoch() == {"epoch_value": 4.0}
    logs.begin_batch()
    with pytest.raises(ValueError, match="shape \\(2,\\).*value.mean"):
        logs.log("vec", torch.ones(2))
    with pytest.raises(ValueError, match="log_dict"):
        logs.log("nested", {"x": 1})
    with pytest.raises(ValueError, match="got str"):
        logs.log("text", "hi")
    logs.end_batch()
    with pytest.warns(RuntimeWarning, match="outside train\\(\\) and validate\\(\\)"):
        logs.log("late", 1.0)
    with pytest.warns(RuntimeWarning, match="averages"):
        logs.begin_epoch()
        logs.log("total", 1.0, reduce_fx="sum")


def test_a_logged_torchmetrics_metric_is_computed_at_the_end_of_the_call():
    torchmetrics = pytest.importorskip("torchmetrics")
    metric = torchmetrics.MeanMetric()
    logs = LogCollector(lambda: True)
    logs.begin_epoch()
    for value in (1.0, 3.0):
        logs.begin_batch()
        metric.update(torch.tensor(value))
        logs.log("mean", metric)
        assert logs.end_batch() == ({}, None)
    assert logs.end_epoch() == {"mean": 2.0}
    assert metric.update_count == 0  # reset for the next call


# ---------------------------------------------------------------- building, stub, checks
def test_constructor_gets_the_config_the_way_it_takes_it():
    class Keyword:
        def __init__(self, lr=1, config=None):
            self.config = config

    class Positional:
        def __init__(self, cfg):
            self.config = cfg

    class Bare:
        def __init__(self, lr=0.1):
            self.config = None

    config = {"x": 1}
    assert building.construct(Keyword, config).config is config
    assert building.construct(Positional, config).config is config
    assert building.construct(Bare, config).config is None


def test_step_signatures_decide_whether_batch_idx_is_passed():
    assert building.takes_batch_idx(lambda batch, batch_idx: 0, "training_step")
    assert building.takes_batch_idx(lambda batch, i: 0, "training_step")
    assert building.takes_batch_idx(lambda *args: 0, "training_step")
    assert not building.takes_batch_idx(lambda batch: 0, "training_step")
    with pytest.raises(ConfigError, match="dataloader_iter"):
        building.takes_batch_idx(lambda dataloader_iter: 0, "training_step")


def test_the_trainer_stub_names_what_is_missing_and_what_to_use():
    stub = TrainerStub(operator=None)
    with pytest.raises(TrainerAttributeError, match="self.trainer.strategy.*all_gather"):
        stub.strategy
    with pytest.raises(TrainerAttributeError, match="estimated_stepping_batches.*config"):
        stub.estimated_stepping_batches
    assert getattr(stub, "fit_loop", "absent") == "absent"  # still an AttributeError
    with pytest.raises(TrainerAttributeError, match="should_stop.*stop calling trainer.train"):
        stub.should_stop = True
    assert stub.max_epochs is None and stub.max_steps == -1


def test_from_ptl_refuses_what_is_not_a_lightning_module_on_the_driver():
    for wrong in (nn.Linear, object, "Module"):
        with pytest.raises(NotALightningModuleError, match="LightningModule subclass"):
            TrainingOperator.from_ptl(wrong)
    with pytest.raises(TypeError, match="Pass the class, not an instance"):
        TrainingOperator.from_ptl(pl.LightningModule())
    with pytest.raises(ConfigError, match="LightningDataModule"):
        TrainingOperator.from_ptl(Recording, datamodule=object())
    with pytest.raises(ConfigError, match="one train loader"):
        TrainingOperator.from_ptl(Recording, train_dataloader=[DataLoader([1]), DataLoader([2])])
    with pytest.raises(ConfigError, match="from_ptl"):
        run(LightningOperator)  # the bare class has no module to build


# ------------------------------------------------- the operator in-process at world size 1
def data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return TensorDataset(x, x.sum(1, keepdim=True))


class Recording(pl.LightningModule):
    """Records hooks; the config's keys switch behaviours on."""

    def __init__(self, config):
        super().__init__()
        torch.manual_seed(0)
        self.config = config
        self.net = nn.Linear(3, 1)
        self.calls, self.seen = [], []

    def forward(self, x):
        return self.net(x)

    def setup(self, stage):
        self.calls.append(f"setup:{stage}")
        self.data = data()

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=16)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=32)

    def configure_optimizers(self):
        self.calls.append("configure_optimizers")
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return self.config.get("optim", lambda opt: opt)(opt)

    def training_step(self, batch, batch_idx):
        self.calls.append("training_step")
        trainer = self.trainer
        self.seen.append((self.current_epoch, self.global_step, trainer.world_size,
                          trainer.is_global_zero, trainer.max_epochs, trainer.training))
        if self.config.get("touch"):
            getattr(trainer, self.config["touch"])
        if batch_idx in self.config.get("skip", ()):
            return None
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("batch_idx", float(batch_idx))
        return {"loss": loss, "extra": torch.tensor(2.0), "ignored": torch.ones(3)}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def on_train_batch_start(self, batch, batch_idx):
        self.calls.append("on_train_batch_start")
        return -1 if batch_idx == self.config.get("stop_at") else None

    def on_save_checkpoint(self, checkpoint):
        checkpoint["calls"] = len(self.calls)


for _hook in ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_epoch_end",
              "on_before_backward", "on_after_backward", "on_before_optimizer_step",
              "on_train_batch_end", "on_validation_start", "on_validation_epoch_start",
              "on_validation_epoch_end", "on_validation_end"):
    def _record(self, *args, _name=_hook):
        self.calls.append(_name)
    setattr(Recording, _hook, _record)


def run(operator_cls, config=None, **settings):
    runner = WorkerRunner(operator_cls, dict(config or {}), WorkerSettings(**settings), RankInfo())
    runner.setup_operator()
    return runner


def module_of(runner):
    return runner.operator.get_model()


def test_hooks_run_in_lightning_order():
    runner = run(TrainingOperator.from_ptl(Recording))
    module = module_of(runner)
    assert module.calls == ["setup:fit", "configure_optimizers", "on_fit_start", "on_train_start"]
    del module.calls[:]
    result = runner.train_epoch(num_steps=1)
    assert module.calls == ["on_train_epoch_start", "on_train_batch_start", "training_step",
                            "on_before_backward", "on_after_backward", "on_before_optimizer_step",
                            "on_train_batch_end", "on_train_epoch_end"]
    assert result["extra"] == 2.0 and "ignored" not in result and result["batch_idx"] == 0.0
    del module.calls[:]
    assert set(runner.validate()) >= {"val_loss", "num_samples"}
    assert module.calls == ["on_validation_start", "on_validation_epoch_start",
                            "on_validation_epoch_end", "on_validation_end"]
    assert module.training  # on_validation_model_train put it back


def test_trainer_attributes_and_step_counters_inside_training_step():
    runner = run(TrainingOperator.from_ptl(Recording))
    runner.train_epoch()
    runner.train_epoch(num_steps=2)
    assert module_of(runner).seen == [(0, 0, 1, True, None, True), (0, 1, 1, True, None, True),
                                      (0, 2, 1, True, None, True), (0, 3, 1, True, None, True),
                                      (1, 4, 1, True, None, True), (1, 5, 1, True, None, True)]
    assert module_of(runner)._trainer is None  # detached between calls: pickles like any module


def test_an_unsupported_trainer_attribute_fails_with_its_name():
    runner = run(TrainingOperator.from_ptl(Recording), {"touch": "precision_plugin"})
    with pytest.raises(TrainerAttributeError, match="self.trainer.precision_plugin.*use_fp16"):
        runner.train_epoch()


def test_minus_one_from_on_train_batch_start_skips_the_rest_of_the_epoch():
    runner = run(TrainingOperator.from_ptl(Recording), {"stop_at": 1})
    first = runner.train_epoch()
    assert first["batch_count"] == 1 and first["epoch"] == 1
    assert runner.train_epoch()["epoch"] == 2  # the pass was used up, as Lightning ends the epoch


def test_a_none_loss_skips_the_optimizer_step():
    runner = run(TrainingOperator.from_ptl(Recording), {"skip": (0,)})
    before = [p.detach().clone() for p in module_of(runner).parameters()]
    result = runner.train_epoch(num_steps=1)
    assert "train_loss" not in result and result["num_samples"] == 16
    assert all(torch.equal(a, b) for a, b in zip(before, module_of(runner).parameters()))
    assert "train_loss" in runner.train_epoch(num_steps=1)


def test_step_interval_scheduler_and_frequency_through_the_lr():
    def optim(opt):
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step",
                                                   "frequency": 2}}

    runner = run(TrainingOperator.from_ptl(Recording), {"optim": optim})
    runner.train_epoch()  # 4 batches: 2 scheduler steps
    assert runner.operator.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 / 4)


def test_plateau_watching_a_validation_metric_steps_after_validate():
    def optim(opt):
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": sched, "monitor": "val_loss"}

    runner = run(TrainingOperator.from_ptl(Recording), {"optim": optim})
    lr = lambda: runner.operator.optimizers[0].param_groups[0]["lr"]  # noqa: E731
    lrs = []
    for _ in range(3):
        runner.train_epoch()
        runner.validate()  # val_loss falls, which mode="max" reads as no improvement
        lrs.append(lr())
    assert lrs == [0.1, 0.05, 0.025]


def test_checkpoint_hooks_and_state_keys_are_the_modules_own():
    runner = run(TrainingOperator.from_ptl(Recording))
    runner.train_epoch()
    state = runner.state_dict()
    assert list(state["models"][0]) == ["net.weight", "net.bias"]
    assert state["operator"]["lightning_checkpoint"]["calls"] == len(module_of(runner).calls)
    assert state["operator"]["schedules"]["epochs_done"] == 1


class DataModule(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.prepared = False

    def prepare_data(self):
        self.prepared = True

    def train_dataloader(self):
        return DataLoader(data(32), batch_size=8)


def test_loaders_come_from_arguments_then_datamodule_then_module():
    runner = run(TrainingOperator.from_ptl(Recording, datamodule=DataModule()))
    assert runner.operator.datamodule.prepared and len(runner.operator.train_loader) == 4
    assert len(runner.operator.validation_loader) == 2  # the datamodule has none: the module's
    given = DataLoader(data(8), batch_size=8)
    runner = run(TrainingOperator.from_ptl(Recording, train_dataloader=given, datamodule=DataModule))
    assert runner.operator.train_loader is given


class Manual(Recording):
    def __init__(self, config):
        super().__init__(config)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        x, y = batch
        loss = F.mse_loss(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        self.clip_gradients(opt, gradient_clip_val=0.5, gradient_clip_algorithm="norm")
        opt.step()
        self.log("gathered", self.all_gather(torch.tensor(3.0)))
        return loss


def test_manual_optimization_at_world_size_one_and_its_setting_checks():
    runner = run(TrainingOperator.from_ptl(Manual))
    first = runner.train_epoch()
    assert first["gathered"] == 3.0 and runner.train_epoch()["train_loss"] < first["train_loss"]
    with pytest.raises(ConfigError, match="accumulate in training_step"):
        run(TrainingOperator.from_ptl(Manual), accumulate_steps=2)
    with pytest.raises(ConfigError, match="self.clip_gradients"):
        run(TrainingOperator.from_ptl(Manual), clip_grad_norm=1.0)


def test_manual_backward_is_refused_under_automatic_optimization():
    class Confused(Recording):
        def training_step(self, batch, batch_idx):
            self.manual_backward(F.mse_loss(self(batch[0]), batch[1]))

    runner = run(TrainingOperator.from_ptl(Confused))
    with pytest.raises(ConfigError, match="automatic_optimization = False"):
        runner.train_epoch()


def test_accumulation_and_clipping_give_the_default_loops_numbers():
    """accumulate_steps and clip_grad_norm: the same weights as TrainingOperator's own loop."""
    class Plain(TrainingOperator):
        def setup(self, config):
            module = Recording(config)
            opt = torch.optim.SGD(module.parameters(), lr=0.1)
            self.register(models=module, optimizers=opt, criterion=nn.MSELoss())
            self.register_data(train_loader=DataLoader(data(), batch_size=16))

    settings = {"accumulate_steps": 2, "clip_grad_norm": 0.1}
    ours, theirs = run(TrainingOperator.from_ptl(Recording), **settings), run(Plain, **settings)
    assert ours.train_epoch()["train_loss"] == theirs.train_epoch()["train_loss"]
    for a, b in zip(module_of(ours).parameters(), theirs.get_models()[0].parameters()):
        assert torch.equal(a, b)


def test_configure_callbacks_is_ignored_with_a_warning():
    class WithCallbacks(Recording):
        def configure_callbacks(self):
            return [pl.callbacks.EarlyStopping(monitor="val_loss")]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(TrainingOperator.from_ptl(WithCallbacks))
    assert any("configure_callbacks() is ignored" in str(w.message) for w in caught)


def test_fp16_loss_scaling_in_both_optimization_modes():
    """use_fp16="fp16" (GradScaler, on CPU for the test): scaled backward, unscaled clipping."""
    for module_cls in (Recording, Manual):
        runner = run(TrainingOperator.from_ptl(module_cls), use_fp16="fp16")
        first = runner.train_epoch()
        assert runner.train_epoch()["train_loss"] < first["train_loss"]
        assert runner.operator._context.precision.scale is not None


def test_extra_backward_arguments_need_an_unscaled_precision():
    class RetainGraph(Manual):
        def training_step(self, batch, batch_idx):
            loss = F.mse_loss(self(batch[0]), batch[1])
            self.manual_backward(loss, retain_graph=True)
            self.optimizers().step()

    run(TrainingOperator.from_ptl(RetainGraph)).train_epoch(num_steps=1)  # fp32: passed through
    runner = run(TrainingOperator.from_ptl(RetainGraph), use_fp16="fp16")
    with pytest.raises(ConfigError, match="extra backward arguments"):
        runner.train_epoch(num_steps=1)


NO_LIGHTNING = """
import sys
sys.modules["pytorch_lightning"] = sys.modules["lightning"] = None  # as if not installed
import raysgd, raysgd.torch
from raysgd import TrainingOperator
try:
    TrainingOperator.from_ptl(object)
except ImportError as error:
    print("ImportError:", error)
"""


def test_raysgd_imports_without_lightning_and_from_ptl_says_what_to_install():
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", "import sys, raysgd, raysgd.torch; print("
                             "[m for m in sys.modules if 'lightning' in m])"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"  # import raysgd never imports Lightning
    out = subprocess.run([sys.executable, "-c", NO_LIGHTNING], capture_output=True, text=True,
                         check=True)
    assert "ImportError:" in out.stdout and "pip install raysgd[lightning]" in out.stdout


def test_the_lightning_base_is_found_in_the_mro_for_either_package():
    from raysgd.lightning.compat import find_base

    assert find_base(Recording, "LightningModule") is pl.LightningModule
    # lightning.pytorch's class, as the `lightning` package names it (not installed here).
    unified = type("LightningModule", (nn.Module,), {"__module__": "lightning.pytorch.core.module"})
    user = type("UserModule", (unified,), {})
    assert find_base(user, "LightningModule") is unified
    impostor = type("LightningModule", (nn.Module,), {"__module__": "mypackage.core"})
    assert find_base(type("Other", (impostor,), {}), "LightningModule") is None
