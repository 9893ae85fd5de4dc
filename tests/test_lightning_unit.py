"""The Lightning adapter without Ray and without training: configure_optimizers parsing,
scheduler timing, logging, the step hooks that average raw optimizers, the trainer stub, the
driver-side checks and what set-up builds. tests/test_lightning_steps_unit.py trains with the
operator in-process."""

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

pl = pytest.importorskip("pytorch_lightning",
                         reason="Lightning tests need pytorch_lightning (pip install raysgd[lightning])")

from raysgd.config import RankInfo, WorkerSettings  # noqa: E402
from raysgd.errors import ConfigError  # noqa: E402
from raysgd.lightning import LightningOperator, building, ddp  # noqa: E402
from raysgd.lightning.errors import NotALightningModuleError, TrainerAttributeError  # noqa: E402
from raysgd.lightning.logs import Logged, LogCollector, LoggedMeters  # noqa: E402
from raysgd.lightning.optim_config import SchedulerSpec, parse_optimizers  # noqa: E402
from raysgd.lightning.schedules import SchedulerStepper  # noqa: E402
from raysgd.lightning.trainer_stub import TrainerStub  # noqa: E402
from raysgd.torch import TrainingOperator  # noqa: E402
from raysgd.worker.runner import WorkerRunner  # noqa: E402


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
    (None, "returned None.*raysgd needs one to register.*lr=0.0"),
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
    every_2nd_batch, every_2nd_epoch = object(), object()
    steps, recorder = stepper(SchedulerSpec(every_2nd_batch, interval="step", frequency=2),
                              SchedulerSpec(every_2nd_epoch, frequency=2))
    for _ in range(2):  # two epochs of 3 batches: Lightning counts batch_idx + 1 per epoch
        for batch_idx in range(3):
            steps.after_batch(batch_idx)
        steps.end_of_batches()
        steps.after_train({}, can_validate=False)
    assert [c[0] for c in recorder.calls] == [every_2nd_batch, every_2nd_batch, every_2nd_epoch]
    assert steps.state_dict() == {"epochs_done": 2, "pending": []}


def test_step_interval_plateau_reads_callback_metrics():
    plateau = SchedulerSpec(object(), interval="step", reduce_on_plateau=True, monitor="val_loss")
    steps, recorder = stepper(plateau)
    steps.after_batch(0)  # plateau schedulers wait for the batch's end
    steps.after_batch_end(0, {"val_loss": torch.tensor(0.25)}, weight=8)
    assert recorder.calls == [(plateau.scheduler, 0.25)]
    with pytest.raises(ConfigError, match="'val_loss'"):
        steps.after_batch_end(1, {"train_loss": torch.tensor(1.0)}, weight=8)


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
    steps.after_batch(0)
    steps.end_of_batches()
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
    assert logs.end_batch() == Logged({"a": 2.0, "b": 2.0}, {"b": 5})
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


def test_a_logged_tensor_is_kept_unread_until_the_summary():
    """Reading a CUDA tensor waits for the GPU: a batch's logged tensors are summed where they
    live. A meta tensor cannot be read at all, so this passing shows nothing read them."""
    logs, meters = LogCollector(lambda: True), LoggedMeters()
    logs.begin_epoch()
    logs.begin_batch()
    logs.log("loss", torch.tensor(2.0, device="meta"))
    logs.log("twice", torch.tensor(1.0, device="meta"))
    logs.log("twice", torch.tensor([3], device="meta"))  # an int, one element: float32, 0-d
    logged = logs.end_batch()
    assert {name: (v.device.type, v.dtype, v.ndim) for name, v in logged.values.items()} == {
        "loss": ("meta", torch.float32, 0), "twice": ("meta", torch.float64, 0)}
    meters.add_logged(logged, num_samples=4)  # no read either
    with pytest.raises(RuntimeError, match="meta"):  # the summary is where it is read
        meters.summary()


def test_a_logged_tensor_subclass_is_read_at_once_as_before():
    class Tagged(torch.Tensor):
        pass

    logs = LogCollector(lambda: True)
    logs.begin_epoch()
    logs.begin_batch()
    logs.log("tagged", torch.tensor(2.5).as_subclass(Tagged))
    values = logs.end_batch().values
    assert values == {"tagged": 2.5} and type(values["tagged"]) is float


def test_a_logged_tensor_changed_in_place_afterwards_keeps_its_logged_value():
    logs, meters, total = LogCollector(lambda: True), LoggedMeters(), torch.zeros(())
    logs.begin_epoch()
    for value in (1.0, 2.0):
        logs.begin_batch()
        total += value  # a running sum the module updates in place
        logs.log("total", total)
        logs.log("half", total / 2)
        total += 10  # changed again before the batch ends
        meters.add_logged(logs.end_batch(), num_samples=1)
        total -= 10
    summary = meters.summary()
    assert (summary["total"], summary["last_total"], summary["half"]) == (2.0, 3.0, 1.0)
    assert isinstance(summary["total"], float)
    logs.log("in_epoch_hook", torch.tensor(5.0))
    returned = logs.end_epoch()  # the call's results: numbers
    assert returned == {"in_epoch_hook": 5.0} and type(returned["in_epoch_hook"]) is float


def test_a_logged_torchmetrics_metric_is_computed_at_the_end_of_the_call():
    torchmetrics = pytest.importorskip("torchmetrics")
    metric = torchmetrics.MeanMetric()
    logs = LogCollector(lambda: True)
    logs.begin_epoch()
    for value in (1.0, 3.0):
        logs.begin_batch()
        metric.update(torch.tensor(value))
        logs.log("mean", metric)
        assert logs.end_batch() == Logged({}, {})
    assert logs.end_epoch() == {"mean": 2.0}
    assert metric.update_count == 0  # reset for the next call


def test_a_rank_zero_only_metric_is_computed_on_every_rank():
    """compute() syncs across processes, so every rank computes it; only rank 0 reports it."""
    torchmetrics = pytest.importorskip("torchmetrics")
    metric, computed = torchmetrics.MeanMetric(), []
    metric.compute = lambda: computed.append(True) or torch.tensor(1.0)
    logs = LogCollector(lambda: False)  # not rank 0
    logs.begin_epoch()
    metric.update(torch.tensor(1.0))
    logs.log("mean", metric, rank_zero_only=True)
    assert logs.end_epoch() == {} and computed == [True]


def test_batch_size_weighs_only_the_value_logged_with_it():
    meters = LoggedMeters()
    for loss, acc, acc_size, samples in ((1.0, 0.0, 1, 10), (3.0, 1.0, 3, 10)):
        meters.update({"train_loss": loss}, n=samples)
        meters.add_logged(Logged({"acc": acc, "seen": loss}, {"acc": acc_size}), samples)
    summary = meters.summary()
    assert summary["train_loss"] == 2.0 and summary["num_samples"] == 20  # batch-weighted
    assert summary["acc"] == 0.75 and summary["last_acc"] == 1.0  # weighted 1 : 3
    assert summary["seen"] == 2.0  # no batch_size=: the batch's samples


# ---------------------------------------------------- gradient averaging on a raw step
def test_every_optimizer_step_averages_first_even_a_raw_one():
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    events = []
    ddp.average_on_step(opt, lambda o: events.append("sync"), lambda o: events.append("forget"))

    def closure():
        events.append("closure")
        model.zero_grad()
        loss = model(torch.ones(1, 2)).sum()
        loss.backward()
        return loss

    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert events == ["sync", "forget"]
    del events[:]
    opt.step(closure)  # gradients exist only once the closure ran: averaged after it
    assert events == ["closure", "forget", "sync", "forget"]
    lbfgs = torch.optim.LBFGS(model.parameters(), max_iter=3)
    ddp.average_on_step(lbfgs, lambda o: events.append("sync"), lambda o: None)
    del events[:]
    lbfgs.step(closure=closure)  # every evaluation of the closure is averaged
    assert events.count("closure") == events.count("sync") > 1


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
    assert stub.accumulate_grad_batches == 1  # accumulate_steps splits a batch inside one step


def test_from_ptl_refuses_what_is_not_a_lightning_module_on_the_driver():
    for wrong in (nn.Linear, object, "Module"):
        with pytest.raises(NotALightningModuleError, match="LightningModule subclass"):
            TrainingOperator.from_ptl(wrong)
    with pytest.raises(NotALightningModuleError, match="an instance of one, or a factory"):
        TrainingOperator.from_ptl(nn.Linear(1, 1))  # a module instance, but not Lightning's
    with pytest.raises(ConfigError, match="LightningDataModule"):
        TrainingOperator.from_ptl(Tiny, datamodule=object())
    with pytest.raises(ConfigError, match="one train loader"):
        TrainingOperator.from_ptl(Tiny, train_dataloader=[DataLoader([1]), DataLoader([2])])
    with pytest.raises(ConfigError, match="from_ptl"):
        built(LightningOperator)  # the bare class has no module to build


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(1, 1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def val_dataloader(self):
        return DataLoader(torch.zeros(4, 1), batch_size=2)

    def validation_step(self, batch, batch_idx):
        self.log("val_zero", batch.sum())


def built(operator_cls):
    runner = WorkerRunner(operator_cls, {}, WorkerSettings(), RankInfo())
    runner.setup_operator()
    return runner.operator


class DataModule(pl.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.prepared = False

    def prepare_data(self):
        self.prepared = True

    def train_dataloader(self):
        return DataLoader(torch.zeros(32, 1), batch_size=8)


def test_loaders_come_from_arguments_then_datamodule_then_module():
    operator = built(TrainingOperator.from_ptl(Tiny, datamodule=DataModule()))
    assert operator.datamodule.prepared and len(operator.train_loader) == 4
    assert len(operator.validation_loader) == 2  # the datamodule has none: the module's
    given = DataLoader(torch.zeros(8, 1), batch_size=8)
    assert built(TrainingOperator.from_ptl(Tiny, train_dataloader=given,
                                           datamodule=DataModule)).train_loader is given


def test_configure_callbacks_is_ignored_with_a_warning():
    class WithCallbacks(Tiny):
        def configure_callbacks(self):
            return [pl.callbacks.EarlyStopping(monitor="val_loss")]

    with pytest.warns(RuntimeWarning, match=r"configure_callbacks\(\) is ignored"):
        built(TrainingOperator.from_ptl(WithCallbacks))


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

    assert find_base(Tiny, "LightningModule") is pl.LightningModule
    # lightning.pytorch's class, as the `lightning` package names it (not installed here).
    unified = type("LightningModule", (nn.Module,), {"__module__": "lightning.pytorch.core.module"})
    user = type("UserModule", (unified,), {})
    assert find_base(user, "LightningModule") is unified
    impostor = type("LightningModule", (nn.Module,), {"__module__": "mypackage.core"})
    assert find_base(type("Other", (impostor,), {}), "LightningModule") is None
