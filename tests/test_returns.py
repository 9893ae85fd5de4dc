"""What user hooks and legacy creators must return (raysgd.worker.returns), checked without Ray: the
pure checks, then the runner at world size 1 and a one-worker local trainer (no Ray, no
process group) showing a wrong return leaves the trained state as it was."""
import types
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from operators_for_tests import LinearOperator, WrongReturnOperator
from raysgd import TorchTrainer
from raysgd.config import RankInfo, WorkerSettings
from raysgd.errors import ConfigError
from raysgd.worker.returns import (batch_metrics, call_metrics, creator_result, short_repr,
                            training_step)
from raysgd.torch import TrainingOperator
from raysgd.torch.examples import train_example
from raysgd.utils import BATCH_SIZE, NUM_SAMPLES
from raysgd.worker.runner import WorkerRunner


class Op:
    """Stands for the user's operator class in messages."""


# ------------------------------------------------------------------- pure checks
def test_a_metrics_dict_is_copied_and_its_values_kept_as_they_are():
    loss, tag, nested = torch.tensor(0.5), object(), {"a": 1}
    given = {"train_loss": loss, "np": np.float32(2.0), "tag": tag, "nested": nested,
             NUM_SAMPLES: 8}
    out = batch_metrics(given, Op(), "train_batch")
    assert out == given and out is not given  # the caller pops num_samples from its copy
    assert out["train_loss"] is loss and out["tag"] is tag and out["nested"] is nested
    assert batch_metrics(None, Op(), "train_batch") == {}
    proxy = types.MappingProxyType({"x": 1.0})
    assert batch_metrics(proxy, Op(), "validate_batch") == {"x": 1.0}
    assert batch_metrics(OrderedDict(x=1), Op(), "train_batch") == {"x": 1}


@pytest.mark.parametrize("count, expected", [
    (np.int64(16), 16), (torch.tensor(16), 16), (torch.tensor(2.5), 2.5), (12.0, 12.0),
    (np.float64(3.0), 3.0)])
def test_num_samples_becomes_a_python_number(count, expected):
    out = batch_metrics({NUM_SAMPLES: count}, Op(), "train_batch")
    assert out[NUM_SAMPLES] == expected and type(out[NUM_SAMPLES]) in (int, float)


@pytest.mark.parametrize("value, shown", [
    (0.25, r"float \(0\.25\)"), ([("train_loss", 1.0)], r"list \(\[\('train_loss', 1\.0\)\]\)"),
    ((1.0, 2), r"tuple \(\(1\.0, 2\)\)"), (torch.tensor(0.5), r"Tensor \(tensor\(0\.5000\)\)"),
    ("loss", r"str \('loss'\)")])
def test_a_batch_hook_returning_no_dict_is_refused_with_the_class_hook_value_and_rule(value, shown):
    with pytest.raises(ConfigError, match=rf"^Op\.train_batch returned {shown}; it must return a "
                                          r"dict of metrics or None, e\.g\. \{'train_loss'"):
        batch_metrics(value, Op(), "train_batch")
    with pytest.raises(ConfigError, match=r"^Op\.validate_batch returned .*\{'val_loss'"):
        batch_metrics(value, Op, "validate_batch")  # the class itself names itself too


@pytest.mark.parametrize("count", ["16", None, True, torch.ones(2), [16]])
def test_num_samples_must_be_a_number(count):
    with pytest.raises(ConfigError, match=r"^Op\.train_batch returned 'num_samples': "
                                          rf"{type(count).__name__} .*it must return "
                                          r"'num_samples' as a number"):
        batch_metrics({"loss": 1.0, NUM_SAMPLES: count}, Op(), "train_batch")


def test_epoch_hooks_return_a_mapping_or_none():
    assert call_metrics({"a": 1}, Op(), "train_epoch") == {"a": 1}
    assert call_metrics(None, Op(), "validate") == {}

    class Stats:  # duck-typed, as Ray 1.12's dict(**stats) took it
        def keys(self):
            return ["loss"]

        def __getitem__(self, key):
            return 0.5

    assert call_metrics(Stats(), Op(), "train_epoch") == {"loss": 0.5}
    for hook in ("train_epoch", "validate"):
        with pytest.raises(ConfigError, match=rf"^Op\.{hook} returned float \(1\.5\); it must "
                                              r"return a dict of metrics or None"):
            call_metrics(1.5, Op(), hook)


def test_the_repr_in_a_message_stays_short():
    assert len(short_repr(list(range(10**6)))) <= 80
    assert len(short_repr("x" * 10_000)) <= 80
    assert len(short_repr(torch.zeros(1000, 1000))) <= 80

    class Broken:
        def __repr__(self):
            raise RuntimeError("no repr")

    assert short_repr(Broken()).startswith("<Broken")  # a broken __repr__ never hides the message


def test_training_step_follows_lightnings_rules():
    loss = torch.tensor(1.0, requires_grad=True)
    assert training_step(loss, "M", automatic=True) == (loss, {})
    assert training_step(None, "M", automatic=True) == (None, {})
    assert training_step({"loss": loss, "acc": 3}, "M", automatic=True) == (loss, {"acc": 3})
    assert training_step({"acc": 3}, "M", automatic=False) == (None, {"acc": 3})  # manual: any dict
    with pytest.raises(ConfigError, match=r"^M\.training_step returned a dict without a 'loss' "
                                          r"\(keys: \['acc'\]\)"):
        training_step({"acc": 3}, "M", automatic=True)
    with pytest.raises(ConfigError, match=r"^M\.training_step returned a dict whose 'loss' is None"):
        training_step({"loss": None}, "M", automatic=True)
    with pytest.raises(ConfigError, match=r"^M\.training_step returned 'loss': float \(0\.5\); it "
                                          r"must return a loss tensor"):
        training_step({"loss": 0.5}, "M", automatic=True)  # Lightning's backward would fail on it
    with pytest.raises(ConfigError, match=r"^M\.training_step returned float \(0\.5\); it must "
                                          r"return a loss tensor, a dict .* or None to skip"):
        training_step(0.5, "M", automatic=True)
    with pytest.raises(ConfigError, match=r"^M\.training_step returned list .*manual optimization"):
        training_step([loss], "M", automatic=False)


def make_model(config):
    return nn.Linear(1, 1)


LOADER = DataLoader(list(range(4)))
MODEL = nn.Linear(1, 1)
OPTIMIZER = torch.optim.SGD(MODEL.parameters(), lr=0.1)
SCHEDULER = torch.optim.lr_scheduler.StepLR(OPTIMIZER, 1)


@pytest.mark.parametrize("kind, value", [
    ("model_creator", MODEL), ("model_creator", [MODEL, nn.Linear(2, 2)]), ("model_creator", (MODEL,)),
    ("optimizer_creator", OPTIMIZER), ("optimizer_creator", [OPTIMIZER, OPTIMIZER]),
    ("scheduler_creator", SCHEDULER), ("scheduler_creator", [SCHEDULER]),
    ("scheduler_creator", torch.optim.lr_scheduler.ReduceLROnPlateau(OPTIMIZER)),
    ("scheduler_creator", None), ("scheduler_creator", []),  # Ray 1.12 registered none then
    ("loss_creator", nn.MSELoss()), ("loss_creator", nn.functional.mse_loss), ("loss_creator", None),
    ("loss_creator", {"rec": nn.MSELoss(), "kl": nn.KLDivLoss()}),  # a custom train_batch's
    ("data_creator", LOADER), ("data_creator", (LOADER, LOADER)), ("data_creator", [LOADER]),
    ("data_creator", (LOADER, None)), ("data_creator", (None, LOADER))])
def test_what_ray_1_12_accepted_from_creators_passes(kind, value):
    assert creator_result(kind, value, make_model, "CreatorOp") is value


@pytest.mark.parametrize("kind, value, rule", [
    ("model_creator", nn.Linear, "a torch.nn.Module"), ("model_creator", make_model, "a torch.nn.Module"),
    ("model_creator", [], "a torch.nn.Module"), ("model_creator", [MODEL, "x"], "a torch.nn.Module"),
    ("optimizer_creator", torch.optim.SGD, "a torch.optim.Optimizer instance"),
    ("optimizer_creator", None, "a torch.optim.Optimizer instance"),
    ("scheduler_creator", torch.optim.lr_scheduler.StepLR, "a learning-rate scheduler instance"),
    ("scheduler_creator", 0.1, "a learning-rate scheduler instance"),
    ("loss_creator", nn.MSELoss, r"a loss instance such as nn\.MSELoss\(\) \(not the class\)"),
    ("data_creator", None, "a train loader, or"), ("data_creator", (LOADER, LOADER, LOADER), "a train"),
    ("data_creator", 3, "a train loader"), ("data_creator", "path/to/data", "a train loader")])
def test_a_creator_returning_the_wrong_thing_is_named_with_its_operator(kind, value, rule):
    with pytest.raises(ConfigError, match=rf"^CreatorOp's {kind} make_model\(\) returned "
                                          rf"{type(value).__name__} \(.*\); it must return {rule}"):
        creator_result(kind, value, make_model, "CreatorOp")


# ---------------------------------------------------------- runner, world size 1
def make_runner(cls, config=None, **settings):
    runner = WorkerRunner(cls, dict(config or {}), WorkerSettings(**settings), RankInfo())
    runner.setup_operator()
    return runner


def weights(runner):
    return [p.detach().clone() for p in runner.operator.model.parameters()]


def test_the_runner_names_a_float_from_train_batch_instead_of_a_type_error():
    runner = make_runner(WrongReturnOperator, {BATCH_SIZE: 100})
    with pytest.raises(ConfigError, match=r"^WrongReturnOperator\.train_batch returned float "
                                          r"\(0\.25\); it must return a dict of metrics or None"):
        runner.train_epoch(info={"bad_return": 0.25})
    with pytest.raises(ConfigError, match=r"^WrongReturnOperator\.validate_batch returned list"):
        runner.validate(info={"bad_return": [1.0]})
    with pytest.raises(ConfigError, match=r"returned 'num_samples': str \('10'\)"):
        runner.train_epoch(info={"bad_return": {"loss": 1.0, NUM_SAMPLES: "10"}})


class LegacyReturnsOperator(LinearOperator):
    """Returns what Ray 1.12's loops took: numpy scalars, tensors, ints, mappings, extra values."""

    def train_batch(self, batch, batch_info):
        metrics = super().train_batch(batch, batch_info)
        index = batch_info["batch_idx"]
        if index == 3:
            return None  # no metrics for this batch (raysgd's own allowance)
        return OrderedDict(train_loss=torch.tensor(metrics["train_loss"]), np_score=np.float32(index),
                           count=index, note=f"batch {index}",
                           num_samples=np.int64(metrics[NUM_SAMPLES]))

    def validate_batch(self, batch, batch_info):
        metrics = super().validate_batch(batch, batch_info)
        return {**metrics, NUM_SAMPLES: torch.tensor(metrics[NUM_SAMPLES])}


def test_legacy_metric_values_still_pass_and_are_averaged():
    runner = make_runner(LegacyReturnsOperator, {BATCH_SIZE: 100})
    result = runner.train_epoch()
    assert result["batch_count"] == 10 and result[NUM_SAMPLES] == 900 + 1  # None counts 1
    assert isinstance(result["train_loss"], float) and result["note"] == "batch 9"
    assert result["count"] == pytest.approx(sum(i for i in range(10) if i != 3) * 100 / 900)
    assert runner.validate()[NUM_SAMPLES] == 400


class EpochReturnsOperator(LinearOperator):
    def train_epoch(self, iterator, info):
        super().train_epoch(iterator, info)
        return info.get("epoch_result", {"done": 1})

    def validate(self, iterator, info):
        return info.get("epoch_result", {"done": 1})


def test_epoch_level_overrides_are_checked_by_the_runner():
    runner = make_runner(EpochReturnsOperator, {BATCH_SIZE: 100})
    assert runner.train_epoch()["done"] == 1
    assert runner.train_epoch(info={"epoch_result": None}) == {"epoch": 2}  # raysgd adds epoch
    with pytest.raises(ConfigError, match=r"^EpochReturnsOperator\.train_epoch returned float "
                                          r"\(0\.1\); it must return a dict of metrics or None"):
        runner.train_epoch(info={"epoch_result": 0.1})
    with pytest.raises(ConfigError, match=r"^EpochReturnsOperator\.validate returned str \('ok'\)"):
        runner.validate(info={"epoch_result": "ok"})


@pytest.mark.parametrize("creators, fragment", [
    ({"model_creator": lambda config: nn.Linear}, r"model_creator <lambda>\(\) returned type"),
    ({"optimizer_creator": lambda model, config: torch.optim.SGD},
     r"optimizer_creator <lambda>\(\) returned type \(<class 'torch\.optim\.sgd\.SGD'>\)"),
    ({"loss_creator": lambda config: nn.MSELoss}, r"loss_creator <lambda>\(\) returned type"),
    ({"scheduler_creator": lambda opt, config: 0.5}, r"scheduler_creator <lambda>\(\) returned float"),
    ({"data_creator": lambda config: None}, r"data_creator <lambda>\(\) returned NoneType"),
])
def test_legacy_creators_results_are_checked_at_set_up(creators, fragment):
    given = {"model_creator": train_example.model_creator,
             "optimizer_creator": train_example.optimizer_creator,
             "data_creator": train_example.data_creator, "loss_creator": nn.MSELoss, **creators}
    operator = TrainingOperator.from_creators(**given)
    with pytest.raises(ConfigError, match=rf"^CustomCreatorOperator's {fragment}"):
        make_runner(operator, scheduler_step_freq="epoch")


def test_a_scheduler_creator_may_return_none_as_in_ray_1_12():
    operator = TrainingOperator.from_creators(
        train_example.model_creator, train_example.optimizer_creator, train_example.data_creator,
        loss_creator=nn.MSELoss, scheduler_creator=lambda optimizer, config: None)
    runner = make_runner(operator, scheduler_step_freq="epoch")
    assert runner.operator._schedulers == [] and runner.train_epoch()["batch_count"] > 0


def test_a_lightning_training_step_returning_a_float_is_named():
    pl = pytest.importorskip("pytorch_lightning", reason="needs pytorch_lightning")

    class FloatStep(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            return loss.item() if self.as_float else loss

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return self.net(x), y  # Lightning takes any output here; it carries no metrics

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(train_example.LinearDataset(2, 5, size=64), batch_size=16)

        def val_dataloader(self):
            return self.train_dataloader()

    FloatStep.as_float = True
    runner = make_runner(TrainingOperator.from_ptl(FloatStep))
    with pytest.raises(ConfigError, match=r"^FloatStep\.training_step returned float \(.*\); it "
                                          r"must return a loss tensor, a dict holding the loss"):
        runner.train_epoch(num_steps=1)
    assert runner.validate() == {"batch_count": 4, NUM_SAMPLES: 64}
    FloatStep.as_float = False
    assert "train_loss" in runner.train_epoch(num_steps=1)


# ------------------------------------------- one local worker: the state is unchanged
def test_a_wrong_return_rolls_back_and_the_trainer_trains_on():
    trainer = TorchTrainer(training_operator_cls=WrongReturnOperator, num_workers=1,
                           use_local=True, use_gpu=False, config={BATCH_SIZE: 100})
    try:
        trainer.train(num_steps=2)

        def state():
            return trainer.apply_all_operators(lambda op: (
                op.global_step, [p.detach().clone() for p in op.model.parameters()],
                {k: v for k, v in op.optimizer.state_dict()["param_groups"][0].items()
                 if k != "params"}))[0]

        before = state()
        with pytest.raises(ConfigError, match=r"WrongReturnOperator\.train_batch returned float"):
            trainer.train(info={"bad_return": 0.25})  # batch 0 stepped, batch 1 returned 0.25
        after = state()
        assert after[0] == before[0] == 2
        assert all(torch.equal(a, b) for a, b in zip(after[1], before[1])) and after[2] == before[2]
        stats = trainer.recovery_stats
        assert stats.user_errors == 1 and stats.failures == 0 and stats.recoveries == 0
        result = trainer.train()
        assert result["batch_count"] == 8 and result["epoch"] == 1  # the pass's other 8 batches
        assert not all(torch.equal(a, b) for a, b in zip(state()[1], before[1]))
    finally:
        trainer.shutdown()
