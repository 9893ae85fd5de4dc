"""The operator and runner driven in-process at world size 1: no Ray."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from operators_for_tests import (DropoutOperator, GANOperator, LegacyEpochOperator, LinearOperator,
                                 NoRegisterOperator)
from raysgd.config import RankInfo, WorkerSettings
from raysgd.errors import CheckpointError, ConfigError
from raysgd.torch import TrainingOperator
from raysgd.torch.examples import train_example
from raysgd.utils import BATCH_SIZE
from raysgd.worker.runner import WorkerRunner


def make_runner(cls, config=None, **settings):
    runner = WorkerRunner(cls, dict(config or {}), WorkerSettings(**settings), RankInfo())
    runner.setup_operator()
    return runner


def linear_weights(runner):
    return [p.detach().clone() for p in runner.operator.model.parameters()]


def test_default_loop_trains_and_reports_metrics():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100})
    first = runner.train_epoch()
    assert first["epoch"] == 1 and first["batch_count"] == 10 and first["num_samples"] == 1000
    assert {"train_loss", "last_train_loss"} <= first.keys()
    for _ in range(5):
        last = runner.train_epoch()
    assert last["epoch"] == 6 and last["train_loss"] < first["train_loss"]
    val = runner.validate()
    assert set(val) == {"batch_count", "num_samples", "val_loss", "last_val_loss",
                        "val_accuracy", "last_val_accuracy"}


def test_num_steps_continues_and_wraps_into_the_next_pass():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100})  # 10 batches a pass
    assert runner.train_epoch(num_steps=4)["batch_count"] == 4
    part = runner.train_epoch(num_steps=4)
    assert part["batch_count"] == 4 and part["epoch"] == 1
    rest = runner.train_epoch()  # finishes pass 1: batches 8 and 9
    assert rest["batch_count"] == 2 and rest["epoch"] == 1
    wrap = runner.train_epoch(num_steps=15)  # all of pass 2, half of pass 3
    assert wrap["batch_count"] == 15 and wrap["epoch"] == 3
    assert runner.operator.global_step == 4 + 4 + 2 + 15


def test_a_call_on_an_exhausted_pass_starts_the_next_pass():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100})
    runner.train_epoch(num_steps=10)  # consumed the pass exactly
    result = runner.train_epoch()
    assert result["batch_count"] == 10 and result["epoch"] == 2  # legacy returned an empty epoch


class IterableOperator(LinearOperator):
    """A train loader without len(): exhaustion is only seen on StopIteration."""

    def setup(self, config):
        super().setup(config)
        batches = list(self.train_loader)

        class NoLen:
            def __iter__(self):
                return iter(batches)

        self.register_data(train_loader=NoLen(), validation_loader=self.validation_loader)


def test_passes_work_without_a_known_length():
    runner = make_runner(IterableOperator, {BATCH_SIZE: 100})
    assert runner.train_epoch(num_steps=10)["epoch"] == 1
    result = runner.train_epoch()
    assert result["batch_count"] == 10 and result["epoch"] == 2
    assert runner.train_epoch(num_steps=12)["epoch"] == 4


class InfoOperator(LinearOperator):
    def train_batch(self, batch, batch_info):
        self.seen = getattr(self, "seen", []) + [dict(batch_info)]
        return super().train_batch(batch, batch_info)


def test_batch_info_carries_position_and_user_info():
    runner = make_runner(InfoOperator, {BATCH_SIZE: 250})  # 4 batches a pass
    runner.train_epoch(num_steps=6, info={"custom": 7})
    seen = runner.operator.seen
    assert [s["batch_idx"] for s in seen] == [0, 1, 2, 3, 0, 1]
    assert [s["epoch_idx"] for s in seen] == [0, 0, 0, 0, 1, 1]
    assert [s["global_step"] for s in seen] == list(range(6))
    assert all(s["custom"] == 7 for s in seen)


def test_legacy_train_epoch_signature_and_info():
    runner = make_runner(LegacyEpochOperator, {BATCH_SIZE: 500})
    result = runner.train_epoch(info={"value": 3})
    assert result["custom_batches"] == 2 and result["info_value"] == 3 and result["epoch"] == 1


def test_multi_model_operator_needs_no_self_model():
    runner = make_runner(GANOperator, {"latent_dim": 2, BATCH_SIZE: 64})
    result = runner.train_epoch()
    assert {"loss_g", "loss_d", "last_loss_g", "last_loss_d"} <= result.keys()
    assert result["num_samples"] == 256


def test_default_train_batch_with_two_models_says_to_override():
    class TwoModels(TrainingOperator):
        def setup(self, config):
            a, b = nn.Linear(1, 1), nn.Linear(1, 1)
            self.register(models=(a, b), optimizers=torch.optim.SGD(a.parameters(), lr=0.1),
                          criterion=nn.MSELoss())
            self.register_data(train_loader=DataLoader(TensorDataset(torch.ones(4, 1), torch.ones(4, 1))))

    runner = make_runner(TwoModels)
    with pytest.raises(ConfigError, match="Override train_batch"):
        runner.train_epoch()


def test_register_returns_the_container_given():
    captured = {}

    class Shapes(TrainingOperator):
        def setup(self, config):
            m1, m2 = nn.Linear(1, 1), nn.Linear(1, 1)
            o1 = torch.optim.SGD(m1.parameters(), lr=0.1)
            captured["two"] = self.register(models=(m1, m2), optimizers=[o1], criterion=nn.MSELoss(),
                                            schedulers=torch.optim.lr_scheduler.StepLR(o1, 1))

    make_runner(Shapes, scheduler_step_freq="epoch")
    models, optimizers, criterion, scheduler = captured["two"]
    assert isinstance(models, tuple) and len(models) == 2
    assert isinstance(optimizers, list) and len(optimizers) == 1  # list in, list out (legacy)
    assert isinstance(criterion, nn.MSELoss)
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)

    class Single(TrainingOperator):
        def setup(self, config):
            m = nn.Linear(1, 1)
            captured["one"] = self.register(models=m, optimizers=torch.optim.SGD(m.parameters(), lr=0.1))

    make_runner(Single)
    model, optimizer = captured["one"]
    assert isinstance(model, nn.Linear) and isinstance(optimizer, torch.optim.SGD)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"models": "not a model"}, "torch.nn.Module"),
    ({"models": [nn.Linear(1, 1), lambda c: None]}, "torch.nn.Module"),
    ({"ddp_args": ["find_unused_parameters"]}, "ddp_args must be a dict"),
    ({"optimizers": None}, "at least one optimizer"),
    ({"schedulers": "SCHED"}, "scheduler_step_freq is None"),
])
def test_register_rejects_bad_input(kwargs, fragment):
    class Bad(TrainingOperator):
        def setup(self, config):
            model = nn.Linear(1, 1)
            args = {"models": model, "optimizers": torch.optim.SGD(model.parameters(), lr=0.1)}
            args.update(kwargs)
            if args.get("schedulers") == "SCHED":
                args["schedulers"] = torch.optim.lr_scheduler.StepLR(args["optimizers"], 1)
            self.register(**args)

    with pytest.raises(ConfigError, match=fragment):
        make_runner(Bad)


def test_setup_without_register_is_an_error():
    with pytest.raises(ConfigError, match="did not call self.register"):
        make_runner(NoRegisterOperator)


def test_state_round_trip_restores_weights_position_and_operator_state():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100, "note": "hello", "shuffle": True})
    runner.train_epoch()
    runner.train_epoch(num_steps=3)
    state = runner.state_dict()
    expected_next = runner.train_epoch(num_steps=4)
    expected_weights = linear_weights(runner)

    fresh = make_runner(LinearOperator, {BATCH_SIZE: 100, "seed": 99, "shuffle": True})
    fresh.load_state_dict(state)
    assert fresh.operator.loaded_note == "hello"
    assert fresh.operator.global_step == 13
    resumed = fresh.train_epoch(num_steps=4)
    assert resumed["epoch"] == expected_next["epoch"] == 2
    assert resumed["train_loss"] == pytest.approx(expected_next["train_loss"], rel=1e-6)
    for a, b in zip(linear_weights(fresh), expected_weights):
        assert torch.allclose(a, b)


def test_load_state_with_wrong_model_count_is_clear():
    runner = make_runner(LinearOperator)
    state = runner.state_dict()
    state["models"].append(state["models"][0])
    with pytest.raises(CheckpointError, match="2 models"):
        runner.load_state_dict(state)


def test_schedulers_step_per_epoch_or_batch():
    epoch_runner = make_runner(LinearOperator, {BATCH_SIZE: 500, "scheduler": True},
                               scheduler_step_freq="epoch")
    epoch_runner.train_epoch()
    assert epoch_runner.operator.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)
    batch_runner = make_runner(LinearOperator, {BATCH_SIZE: 500, "scheduler": True},
                               scheduler_step_freq="batch")
    batch_runner.train_epoch()
    assert batch_runner.operator.optimizer.param_groups[0]["lr"] == pytest.approx(0.0025)
    manual = make_runner(LinearOperator, {BATCH_SIZE: 500, "scheduler": True},
                         scheduler_step_freq="manual")
    manual.train_epoch()
    assert manual.operator.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)
    manual.update_scheduler(0.5)
    assert manual.operator.optimizer.param_groups[0]["lr"] == pytest.approx(0.005)


def test_profile_reports_timers_only_when_asked():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100})
    assert "profile" not in runner.train_epoch()
    profile = runner.train_epoch(profile=True)["profile"]
    assert {"mean_fwd_s", "mean_grad_s", "mean_apply_s", "train_epoch_s"} <= profile.keys()
    assert {"mean_eval_fwd_s", "validation_s"} <= runner.validate(profile=True)["profile"].keys()


def test_classification_accuracy_in_default_validate():
    class Classifier(TrainingOperator):
        def setup(self, config):
            model = nn.Linear(2, 2)
            with torch.no_grad():
                model.weight.copy_(torch.eye(2))
                model.bias.zero_()
            self.register(models=model, optimizers=torch.optim.SGD(model.parameters(), lr=0.0),
                          criterion=nn.CrossEntropyLoss())
            x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
            y = torch.tensor([0, 1, 1, 1])  # 3 of 4 right
            self.register_data(validation_loader=DataLoader(TensorDataset(x, y), batch_size=2))

    result = make_runner(Classifier).validate()
    assert result["val_accuracy"] == pytest.approx(0.75)
    assert result["num_samples"] == 4


def test_from_creators_builds_a_working_operator(tmp_path):
    cls = TrainingOperator.from_creators(
        train_example.model_creator, train_example.optimizer_creator,
        data_creator=train_example.data_creator, loss_creator=nn.MSELoss,
        scheduler_creator=train_example.scheduler_creator)
    runner = make_runner(cls, {"lr": 1e-2, BATCH_SIZE: 100}, scheduler_step_freq="epoch")
    assert runner.train_epoch()["num_samples"] == 1000
    assert runner.validate()["num_samples"] == 400
    assert isinstance(runner.operator.model, nn.Linear)
    with pytest.raises(ConfigError, match="model_creator"):
        TrainingOperator.from_creators(None, train_example.optimizer_creator)


def test_loss_creator_may_take_config():
    cls = TrainingOperator.from_creators(
        train_example.model_creator, train_example.optimizer_creator,
        data_creator=lambda config: DataLoader(train_example.LinearDataset(1, 0, 20), batch_size=5),
        loss_creator=lambda config: nn.L1Loss())
    runner = make_runner(cls)
    assert isinstance(runner.operator.criterion, nn.L1Loss)
    assert runner.operator.validation_loader is None
    assert runner.train_epoch()["batch_count"] == 4


def test_commit_mid_call_and_resume_gives_identical_weights_and_metrics():
    config = {BATCH_SIZE: 50, "shuffle": True}
    reference = make_runner(DropoutOperator, config)
    reference.commit_every = 7
    reference.train_epoch()
    expected = reference.train_epoch()  # 20 batches; commits at steps 21, 28, 35
    assert reference._commits.handoff.steps() == [14, 21, 28, 35]  # nobody took them: the last four
    commit = reference.next_commit(after=28)
    assert commit["step"] == 35 and commit["call_done"] == 15

    resumed = make_runner(DropoutOperator, dict(config, seed=123))
    resumed.restore(commit, commit)
    result = resumed.train_epoch(resume=True)
    assert result["epoch"] == expected["epoch"] == 2
    assert result["batch_count"] == expected["batch_count"] == 20  # meters came with the commit
    assert result["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-12)
    for a, b in zip(linear_weights(resumed), linear_weights(reference)):
        assert torch.equal(a, b)
    assert resumed.first_step_wall is not None


def test_resumed_num_steps_call_runs_only_the_remainder():
    runner = make_runner(LinearOperator, {BATCH_SIZE: 100})
    runner.commit_every = 4
    runner.train_epoch(num_steps=6)  # commit at step 4, call_done 4
    commit = runner.next_commit(after=0)
    fresh = make_runner(LinearOperator, {BATCH_SIZE: 100})
    fresh.restore(commit, commit)
    assert fresh.train_epoch(num_steps=6 - commit["call_done"], resume=True)["batch_count"] == 6
    assert fresh._passes.steps == runner._passes.steps == 6


def test_a_mid_pass_state_moves_to_a_shorter_loader():
    long = make_runner(LinearOperator, {BATCH_SIZE: 100})  # 10 batches a pass
    long.train_epoch(num_steps=7)
    state = long.state_dict()
    short = make_runner(LinearOperator, {BATCH_SIZE: 200})  # 5 batches a pass
    with pytest.warns(UserWarning, match="only 5 batches"):
        short.load_state_dict(state)
    result = short.train_epoch()
    assert result["epoch"] == 2 and result["batch_count"] == 5


def test_host_copies_never_alias_the_live_tensors():
    from raysgd.worker.host_copy import host_copies

    weight = torch.nn.Parameter(torch.ones(3))
    state = {"models": [{"w": weight}], "step": 4, "pair": (torch.zeros(2), "x")}
    copies = host_copies(state)
    assert copies["step"] == 4 and copies["pair"][1] == "x"
    copied = copies["models"][0]["w"]
    assert not copied.requires_grad and torch.equal(copied, weight.detach())
    with torch.no_grad():
        weight.add_(1)
    assert torch.equal(copied, torch.ones(3))  # a copy, not a view of the parameter


def _model_state(snapshot):
    from raysgd.state.packing import unpack_tensors

    state = unpack_tensors(snapshot["state"])
    return state["models"], state["optimizers"]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _reference_commits(config):
    """The commits of steps 14..35 of a runner whose commits copy (nobody takes them)."""
    _seed_all()
    reference = make_runner(DropoutOperator, config)
    reference.commit_every = 7
    reference.train_epoch()
    reference.train_epoch()
    return {step: reference.next_commit(after=step - 1) for step in (14, 21, 28, 35)}


def _seed_all():
    import random

    import numpy as np

    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


def _views_runner(config, wait_s):
    _seed_all()
    runner = WorkerRunner(DropoutOperator, dict(config), WorkerSettings(), RankInfo(),
                          commit_every=7, commit_wait_s=wait_s, commit_views=True)
    runner.setup_operator()
    runner._commits.content.min_bytes = 0  # view this tiny model's state too
    return runner


def test_commits_that_view_the_live_state_are_exact_once_stored():
    """A remote rank's commits view its parameters and optimizer state until the driver
    acknowledges them; a "driver" thread here takes each, stores it slowly (as Ray copies it
    into the object store) and only then asks again. Each stored commit must equal the
    copying runner's commit of the same step, bit for bit."""
    import threading
    import time

    from raysgd.state.packing import own_copies

    config = {BATCH_SIZE: 50, "shuffle": True}
    expected = _reference_commits(config)
    runner = _views_runner(config, wait_s=10)
    stored, stop = {}, threading.Event()

    def driver():
        after = 0
        while not stop.is_set():
            commit = runner.next_commit(after, wait_s=0.1)
            if commit is not None:
                time.sleep(0.02)  # the training thread runs on meanwhile, until its step
                stored[commit["step"]] = own_copies(commit)
                after = commit["step"]

    thread = threading.Thread(target=driver)
    thread.start()
    try:
        runner.train_epoch()
        runner.train_epoch()
    finally:
        stop.set()
        thread.join(5)
    assert set(expected) <= set(stored)
    for step, commit in expected.items():
        assert _same(_model_state(stored[step]), _model_state(commit)), step


def test_untaken_commits_that_view_the_live_state_get_their_own_copies():
    config = {BATCH_SIZE: 50, "shuffle": True}
    expected = _reference_commits(config)
    runner = _views_runner(config, wait_s=0.001)  # nobody takes them
    runner.train_epoch()
    runner.train_epoch()
    assert runner._commits.handoff.steps() == [14, 21, 28, 35]
    for step, commit in expected.items():
        assert _same(_model_state(runner.next_commit(after=step - 1)),
                     _model_state(commit)), step
    profile = runner.train_epoch(profile=True)["profile"]
    assert profile["commits"] == 3 and profile["commit_hold_s"] > 0  # steps 42, 49, 56


class WritesBeforeStepOperator(LinearOperator):
    """Writes its parameters in place before the batch's optimizer step (as a hand-written
    weight clamp at the start of a batch would)."""

    def train_batch(self, batch, batch_info):
        with torch.no_grad():
            self.model.weight.clamp_(-100.0, 100.0)
        return super().train_batch(batch, batch_info)


def test_a_write_outside_a_step_makes_commits_copy_and_commit_again(caplog):
    from raysgd.worker.live_state import CopiedCommits, LiveCommits

    runner = WorkerRunner(WritesBeforeStepOperator, {BATCH_SIZE: 100}, WorkerSettings(),
                          RankInfo(), commit_every=4, commit_wait_s=0.001, commit_views=True)
    runner.setup_operator()
    assert isinstance(runner._commits.content, LiveCommits)
    runner._commits.content.min_bytes = 0  # view this tiny model's state too
    with caplog.at_level("WARNING", logger="raysgd"):
        runner.train_epoch()  # 10 batches: a viewing commit at step 4, then one at 5
    assert "written outside an optimizer step while the commit of step 4" in caplog.text
    assert isinstance(runner._commits.content, CopiedCommits)
    assert runner._commits.handoff.steps() == [4, 5, 8]


def test_writes_in_a_step_keep_commits_viewing(caplog):
    from raysgd.worker.live_state import LiveCommits

    runner = _views_runner({BATCH_SIZE: 50, "shuffle": True}, wait_s=0.001)
    with caplog.at_level("WARNING", logger="raysgd"):
        runner.train_epoch()
    assert "outside an optimizer step" not in caplog.text
    assert isinstance(runner._commits.content, LiveCommits)


def test_a_small_state_is_copied_even_where_commits_may_view():
    runner = WorkerRunner(WritesBeforeStepOperator, {BATCH_SIZE: 100}, WorkerSettings(),
                          RankInfo(), commit_every=4, commit_wait_s=0.001, commit_views=True)
    runner.setup_operator()
    runner.train_epoch()  # its writes before each step would be reported if commits viewed
    assert not runner._commits.content.views()
    assert runner._commits.handoff.steps() == [4, 8]
