"""The Lightning operator driven in-process at world size 1 (no Ray): hook order, steps and
their schedulers, logging, train/eval modes, precision, checkpoints and the settings checks."""
import copy
import io
import os
import sys
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning",
                         reason="Lightning tests need pytorch_lightning (pip install raysgd[lightning])")

from raysgd.config import RankInfo, WorkerSettings  # noqa: E402
from raysgd.errors import ConfigError  # noqa: E402
from raysgd.lightning.errors import TrainerAttributeError  # noqa: E402
from raysgd.torch import TrainingOperator  # noqa: E402
from raysgd.worker.runner import WorkerRunner  # noqa: E402


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
        self.calls, self.seen, self.norms, self.step_norms = [], [], [], []

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
        if self.config.get("no_loss"):
            return {"mse": loss}
        return {"loss": loss, "extra": torch.tensor(2.0), "ignored": torch.ones(3)}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))

    def on_train_batch_start(self, batch, batch_idx):
        self.calls.append("on_train_batch_start")
        return -1 if batch_idx == self.config.get("stop_at") else None

    def configure_gradient_clipping(self, optimizer, *args, **kwargs):
        self.calls.append("configure_gradient_clipping")
        super().configure_gradient_clipping(optimizer, *args, **kwargs)
        self.norms.append(grad_norm(self))

    def on_before_optimizer_step(self, optimizer):
        self.calls.append("on_before_optimizer_step")
        self.step_norms.append(grad_norm(self))

    def on_save_checkpoint(self, checkpoint):
        checkpoint["calls"] = len(self.calls)


def grad_norm(module):
    return float(torch.norm(torch.stack([p.grad.norm() for p in module.parameters()])))


for _hook in ("on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_epoch_end",
              "optimizer_step", "on_before_zero_grad", "optimizer_zero_grad", "on_before_backward",
              "on_after_backward", "on_train_batch_end", "on_validation_model_eval",
              "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start",
              "on_validation_batch_end", "on_validation_epoch_end", "on_validation_end"):
    def _record(self, *args, _name=_hook, _base=getattr(pl.LightningModule, _hook)):
        self.calls.append(_name)  # then Lightning's own hook (some have work to do)
        _base(self, *args)
    setattr(Recording, _hook, _record)


def run(operator_cls, config=None, **settings):
    runner = WorkerRunner(operator_cls, dict(config or {}), WorkerSettings(**settings), RankInfo())
    runner.setup_operator()
    return runner


def module_of(runner):
    return runner.operator.get_model()


def lr_of(runner):
    return runner.operator.optimizers[0].param_groups[0]["lr"]


def test_hooks_run_in_lightning_order():
    runner = run(TrainingOperator.from_ptl(Recording))
    module = module_of(runner)
    assert module.calls == ["setup:fit", "configure_optimizers", "on_fit_start", "on_train_start"]
    del module.calls[:]
    result = runner.train_epoch(num_steps=1)
    # Lightning 2.x: the closure runs training_step, then zero_grad, then backward.
    assert module.calls == ["on_train_epoch_start", "on_train_batch_start", "optimizer_step",
                            "training_step", "on_before_zero_grad", "optimizer_zero_grad",
                            "on_before_backward", "on_after_backward", "on_before_optimizer_step",
                            "configure_gradient_clipping", "on_train_batch_end",
                            "on_train_epoch_end"]
    assert result["extra"] == 2.0 and "ignored" not in result and result["batch_idx"] == 0.0
    del module.calls[:]
    assert set(runner.validate()) >= {"val_loss", "num_samples"}
    batch = ["on_validation_batch_start", "on_validation_batch_end"]
    assert module.calls == ["on_validation_model_eval", "on_validation_start",
                            "on_validation_epoch_start", *batch, *batch,
                            "on_validation_epoch_end", "on_validation_end"]
    assert module.training  # the modes from before validate() are back


class FrozenNorm(Recording):
    """A frozen BatchNorm (eval mode from __init__) must stay frozen, as Lightning leaves it."""

    def __init__(self, config):
        super().__init__(config)
        self.norm = nn.BatchNorm1d(3)
        self.norm.eval()

    def forward(self, x):
        return self.net(self.norm(x))


def test_a_submodule_in_eval_mode_stays_there_across_train_and_validate():
    runner = run(TrainingOperator.from_ptl(FrozenNorm))
    module = module_of(runner)
    runner.train_epoch()
    runner.validate()
    runner.train_epoch()
    assert module.training and module.net.training and not module.norm.training
    assert int(module.norm.num_batches_tracked) == 0  # never updated its statistics

    class OwnTrainHook(FrozenNorm):
        def on_validation_model_train(self):
            self.calls.append("on_validation_model_train")
            self.train()  # an override is called, and is what decides

    runner = run(TrainingOperator.from_ptl(OwnTrainHook))
    runner.validate()
    assert module_of(runner).calls[-1] == "on_validation_model_train"
    assert module_of(runner).norm.training


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


def test_a_none_loss_skips_the_step_and_a_dict_needs_its_loss():
    runner = run(TrainingOperator.from_ptl(Recording), {"skip": (0,)})
    before = [p.detach().clone() for p in module_of(runner).parameters()]
    result = runner.train_epoch(num_steps=1)
    assert "train_loss" not in result and result["num_samples"] == 16
    assert all(torch.equal(a, b) for a, b in zip(before, module_of(runner).parameters()))
    assert "train_loss" in runner.train_epoch(num_steps=1)
    runner = run(TrainingOperator.from_ptl(Recording), {"no_loss": True})
    with pytest.raises(ConfigError, match=r"without a 'loss' \(keys: \['mse'\]\).*'loss': loss"):
        runner.train_epoch(num_steps=1)


@pytest.mark.filterwarnings("ignore:Detected call of")  # torch's, as under Lightning
def test_step_interval_scheduler_counts_batches_per_epoch_like_lightning():
    def optim_every(frequency):
        def optim(opt):
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step",
                                                       "frequency": frequency}}
        return optim

    runner = run(TrainingOperator.from_ptl(Recording), {"optim": optim_every(3)})
    for _ in range(3):  # 4 batches an epoch: after batch_idx 2 only (12 batches: 3 steps, not 4)
        runner.train_epoch()
    assert lr_of(runner) == pytest.approx(0.1 * 0.5 ** 3)
    runner = run(TrainingOperator.from_ptl(Recording), {"optim": optim_every(2), "skip": (0, 1)})
    runner.train_epoch()  # after batch_idx 1 and 3: a skipped optimizer step counts too
    assert lr_of(runner) == pytest.approx(0.1 * 0.5 ** 2)


@pytest.mark.parametrize("interval", ["epoch", "step"])
def test_plateau_watching_a_validation_metric(interval):
    def optim(opt):
        sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": interval,
                                                   "monitor": "val_loss", "strict": False}}

    runner = run(TrainingOperator.from_ptl(Recording), {"optim": optim})
    lrs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            runner.train_epoch()
            runner.validate()  # val_loss falls, which mode="max" reads as no improvement
            lrs.append(lr_of(runner))
    if interval == "epoch":  # steps after each validate(), once per epoch
        assert lrs == [0.1, 0.05, 0.025] and not caught
    else:  # steps every batch, reading the last validate()'s val_loss from callback_metrics
        assert lrs == pytest.approx([0.1, 0.1 * 0.5 ** 3, 0.1 * 0.5 ** 7])  # 1st: the best yet
        assert len(caught) == 4 and "skipping" in str(caught[0].message)  # before any validate()


def test_checkpoint_hooks_and_state_keys_are_the_modules_own():
    runner = run(TrainingOperator.from_ptl(Recording))
    runner.train_epoch()
    state = runner.state_dict()
    assert list(state["models"][0]) == ["net.weight", "net.bias"]
    assert state["operator"]["lightning_checkpoint"]["calls"] == len(module_of(runner).calls)
    assert state["operator"]["schedules"]["epochs_done"] == 1

    class StoresAnObject(Recording):
        def on_save_checkpoint(self, checkpoint):
            checkpoint["extra"] = {"sizes": [1, object()]}

    with pytest.warns(RuntimeWarning, match=r"'object' at checkpoint\['extra'\]\['sizes'\]\[1\]"):
        run(TrainingOperator.from_ptl(StoresAnObject)).state_dict()


class SavesItself(Recording):
    def training_step(self, batch, batch_idx):
        buffer = io.BytesIO()
        torch.save(self, buffer)  # the operator (and its process group) must not come along
        buffer.seek(0)
        self.copies = [torch.load(buffer, weights_only=False), copy.deepcopy(self)]
        return super().training_step(batch, batch_idx)


def test_torch_save_and_deepcopy_of_the_module_inside_a_hook():
    runner = run(TrainingOperator.from_ptl(SavesItself))
    runner.train_epoch(num_steps=1)
    saved, copied = module_of(runner).copies
    for clone in (saved, copied):
        assert not {"log", "optimizers", "__getstate__"} & set(vars(clone))
        assert clone._trainer is None and torch.equal(clone.net.bias, saved.net.bias)


class LogsWeights(Recording):
    def on_train_batch_start(self, batch, batch_idx):
        self.log("started", float(batch_idx))  # a batch value, like Lightning's
        self.log("weighted", float(batch_idx), batch_size=batch_idx + 1)


def test_logged_batch_size_weighs_only_its_value_and_batch_hooks_log_per_batch():
    result = run(TrainingOperator.from_ptl(LogsWeights)).train_epoch()
    assert result["started"] == 1.5 and result["last_started"] == 3.0  # mean of 0, 1, 2, 3
    assert result["weighted"] == pytest.approx((0 * 1 + 1 * 2 + 2 * 3 + 3 * 4) / 10)
    assert result["num_samples"] == 64 and result["batch_count"] == 4  # the batch's own weight


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
        self.norms.append(grad_norm(self))
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


class ManualFromSetup(Recording):
    """automatic_optimization set in setup(): read after the setup hooks, and used everywhere."""

    def setup(self, stage):
        super().setup(stage)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        self.automatic_optimization = True  # changing it later changes nothing
        opt = self.optimizers(use_pl_optimizer=False)  # a raw optimizer steps too
        opt.zero_grad()
        self.manual_backward(F.mse_loss(self(batch[0]), batch[1]))
        opt.step()


def test_the_optimization_mode_is_read_once_after_the_setup_hooks():
    runner = run(TrainingOperator.from_ptl(ManualFromSetup))
    before = [p.detach().clone() for p in module_of(runner).parameters()]
    runner.train_epoch()
    assert not runner.operator.optimization.automatic
    assert not any(torch.equal(a, b) for a, b in zip(before, module_of(runner).parameters()))

    class Confused(Recording):  # automatic optimization has no manual_backward
        def training_step(self, batch, batch_idx):
            self.manual_backward(F.mse_loss(self(batch[0]), batch[1]))

    with pytest.raises(ConfigError, match="automatic_optimization = False"):
        run(TrainingOperator.from_ptl(Confused)).train_epoch()


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


def test_fp16_loss_scaling_in_both_optimization_modes():
    """use_fp16="fp16" (GradScaler, on CPU for the test): scaled backward, unscaled clipping."""
    for module_cls, settings, max_norm in ((Recording, {"clip_grad_norm": 0.1}, 0.1),
                                           (Manual, {}, 0.5)):
        runner = run(TrainingOperator.from_ptl(module_cls), use_fp16="fp16", **settings)
        first = runner.train_epoch()
        assert runner.train_epoch()["train_loss"] < first["train_loss"]
        assert runner.operator._context.precision.scale > 1000  # the loss really was scaled
        module = module_of(runner)
        finite = [i for i, norm in enumerate(module.norms) if norm == norm and norm < float("inf")]
        assert len(module.norms) == 8 and len(finite) >= 4  # early overflows lower the scale
        clipped = [module.norms[i] for i in finite]  # right after clipping
        assert max(clipped) <= max_norm * 1.001 and min(clipped) > max_norm / 100
        if module_cls is Recording:  # on_before_optimizer_step (before clipping): unscaled
            assert 0 < max(module.step_norms[i] for i in finite) < 100
        else:  # on_before_optimizer_step (after clip_gradients): the same, not unscaled twice
            assert [module.step_norms[i] for i in finite] == pytest.approx(clipped)


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


class RaysgdReads(TorchDispatchMode):
    """Counts the tensor reads (``.item()``, ``float(t)``) that raysgd's own code makes.

    A read is raysgd's when the frame that asked for it (past torch's tensor methods) is in
    ``raysgd/``: the DataLoader's own seed draw is torch's. The progress report is left
    out: it reads a CPU loss at once because that costs nothing, and a GPU one at most
    once a second. On a GPU each read waits for the GPU.
    """

    # The frames between the reader and this mode: torch's tensor methods and dispatch.
    PASSED = tuple(os.path.join("torch", *name.split("/")) for name in (
        "_tensor.py", "overrides.py", "utils/_python_dispatch.py", "_compile.py",
        "_dynamo/eval_frame.py"))

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.endswith(self.PASSED):
                frame = frame.f_back
            where = frame.f_code.co_filename if frame is not None else ""
            if f"{os.sep}raysgd{os.sep}" in where and not where.endswith("progress.py"):
                self.count += 1
        return func(*args, **(kwargs or {}))


class Logging(pl.LightningModule):
    """Logs tensors from every step hook and returns tensor extras, in either optimization."""

    def __init__(self, config):
        super().__init__()
        self.automatic_optimization = config.get("automatic", True)
        self.net = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("mse", loss, on_epoch=True)
        self.log_dict({"first": loss * 2, "weighted": loss.abs()}, batch_size=4)
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return {"loss": loss, "extra": loss.detach() + 1}

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.log("after", outputs["loss"].detach())
        outputs["loss"].mul_(0)  # in place, after the step: what raysgd recorded must not change

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_mse", F.mse_loss(self(x), y))
        return {"val_extra": torch.ones(())}

    def forward(self, x):
        return self.net(x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        return DataLoader(data(128), batch_size=8)

    def val_dataloader(self):
        return DataLoader(data(128), batch_size=8)


@pytest.mark.parametrize("automatic", [True, False])
def test_no_step_reads_a_logged_value_or_the_loss(automatic):
    """What raysgd reads per call is the same for 2 batches as for 12 (one read per metric at
    the summary): nothing is read per step, so on a GPU no step waits for it."""
    runner = run(TrainingOperator.from_ptl(Logging), {"automatic": automatic})
    counts = {}
    for steps in (2, 12):
        with RaysgdReads() as reads:
            result = runner.train_epoch(num_steps=steps)
            validated = runner.validate(num_steps=steps)
        counts[steps] = reads.count
        assert type(result["train_loss"]) is float and type(result["mse_epoch"]) is float
        assert result["train_loss"] > 0 and result["after"] > 0
        assert type(validated["val_mse"]) is float and validated["val_extra"] == 1.0
        assert not [key for key, value in {**result, **validated}.items()
                    if isinstance(value, torch.Tensor)]  # results hold numbers
    assert counts[2] == counts[12] > 0
    callback = runner.operator.callback_metrics
    assert isinstance(callback["mse_step"], torch.Tensor) and callback["mse_step"].ndim == 0
