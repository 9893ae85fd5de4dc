"""Ray 1.12's call semantics, checked without Ray: the runner in-process at world size 1,
the trainer with a fake worker group, and the pure pieces (``raysgd.worker.hooks``)."""
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from operators_for_tests import LinearOperator
from raysgd.config import RankInfo, WorkerSettings
from raysgd.errors import ConfigError
from raysgd.torch.constants import NUM_STEPS, SCHEDULER_STEP, USE_FP16
from raysgd.torch.training_operator import TrainingOperator, get_test_operator
from raysgd.utils import BATCH_SIZE
from raysgd.worker.hooks import accepted_keywords, call_info
from raysgd.worker.runner import WorkerRunner


def make_runner(cls, config=None, **settings):
    runner = WorkerRunner(cls, dict(config or {}), WorkerSettings(**settings), RankInfo())
    runner.setup_operator()
    return runner


class Recorder(LinearOperator):
    """Records what each train_epoch / validate call receives."""

    def setup(self, config):
        super().setup(config)
        self.calls = []

    def train_epoch(self, iterator, info=None, num_steps=None, epoch_idx=0):
        self.calls.append(("train", dict(info), num_steps, epoch_idx))
        return super().train_epoch(iterator, info)

    def validate(self, iterator, info=None):
        self.calls.append(("validate", dict(info), None, None))
        return super().validate(iterator, info)


def test_keyword_signature_gets_real_num_steps_and_legacy_epoch_idx():
    runner = make_runner(Recorder, {BATCH_SIZE: 250}, scheduler_step_freq="epoch")  # 4 a pass
    runner.train_epoch()               # pass 1 whole
    runner.train_epoch(num_steps=3)    # pass 2, batches 0-2
    runner.train_epoch(num_steps=3)    # pass 2 batch 3, pass 3 batches 0-1
    calls = [(num_steps, epoch_idx) for kind, _, num_steps, epoch_idx in runner.operator.calls]
    # epoch_idx is what Ray 1.12 passed: the passes started before the call.
    assert calls == [(None, 0), (3, 1), (3, 2)]


def test_info_carries_the_legacy_keys_under_the_users_own():
    runner = make_runner(Recorder, {BATCH_SIZE: 500}, scheduler_step_freq="manual")
    runner.train_epoch(num_steps=1, info={"custom": 1, "epoch_idx": 42})
    runner.validate(num_steps=2, info={"custom": 2})
    (_, train_info, _, _), (_, val_info, _, _) = runner.operator.calls
    assert train_info == {NUM_STEPS: 1, SCHEDULER_STEP: "manual", USE_FP16: False,
                          "epoch_idx": 42, "custom": 1}  # the user's key wins
    assert val_info == {NUM_STEPS: 2, SCHEDULER_STEP: "manual", USE_FP16: False,
                        "epoch_idx": 1, "custom": 2}


def test_two_argument_override_still_works():
    class TwoArgs(LinearOperator):
        def train_epoch(self, iterator, info):
            return {"batches": sum(1 for _ in iterator), "steps": info[NUM_STEPS]}

    result = make_runner(TwoArgs, {BATCH_SIZE: 500}).train_epoch(num_steps=3)
    assert result["batches"] == 3 and result["steps"] == 3


def test_signature_is_read_once_at_setup():
    def kwargs_only(iterator, info, **kw):
        pass

    def named(iterator, info=None, epoch_idx=0):
        pass

    def positional_only(iterator, info, num_steps, /):
        pass

    assert accepted_keywords(kwargs_only) == {"num_steps", "epoch_idx"}
    assert accepted_keywords(named) == {"epoch_idx"}
    assert accepted_keywords(positional_only) == frozenset()
    assert accepted_keywords(len) == frozenset()
    settings = WorkerSettings(use_fp16="bf16", scheduler_step_freq="batch")
    assert call_info(None, None, 0, settings) == {
        NUM_STEPS: None, SCHEDULER_STEP: "batch", USE_FP16: "bf16", "epoch_idx": 0}


class Numbers(LinearOperator):
    """Ten one-sample batches 0..9 for both loaders; validate reports their mean."""

    def setup(self, config):
        super().setup(config)
        numbers = torch.arange(10.0)
        loader = DataLoader(list(zip(numbers[:, None], numbers[:, None])), batch_size=1)
        self.register_data(train_loader=loader, validation_loader=loader)

    def validate(self, iterator, info=None):
        seen = [int(target) for _, target in iterator]
        return {"seen": seen}


def test_validate_num_steps_continues_and_wraps_and_plain_validate_finishes_the_pass():
    runner = make_runner(Numbers)
    assert runner.validate()["seen"] == list(range(10))  # a whole pass
    assert runner.validate(num_steps=4)["seen"] == [0, 1, 2, 3]
    assert runner.validate(num_steps=4)["seen"] == [4, 5, 6, 7]
    assert runner.validate(num_steps=4)["seen"] == [8, 9, 0, 1]  # wraps, as legacy did
    assert runner.validate()["seen"] == list(range(2, 10))  # finishes the pass it is in
    assert runner.validate()["seen"] == list(range(10))  # then whole passes again
    assert runner.validate(num_steps=10)["seen"] == list(range(10))
    assert runner.validate()["seen"] == list(range(10))  # not an empty pass


def test_an_empty_validation_loader_validates_nothing():
    class Empty(LinearOperator):
        def setup(self, config):
            super().setup(config)
            self.register_data(train_loader=self.train_loader, validation_loader=DataLoader([]))

    runner = make_runner(Empty, {BATCH_SIZE: 500})
    assert runner.validate()["batch_count"] == 0
    assert runner.validate(num_steps=3)["batch_count"] == 0


def test_register_returns_lists_for_lists_as_legacy_did():
    captured = {}

    class Lists(TrainingOperator):
        def setup(self, config):
            models = [nn.Linear(1, 1), nn.Linear(1, 1)]
            optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
            captured["out"] = self.register(models=models, optimizers=optimizers,
                                            schedulers=[], criterion=nn.MSELoss())

    make_runner(Lists, scheduler_step_freq="epoch")
    models, optimizers, criterion, schedulers = captured["out"]
    assert type(models) is list and type(optimizers) is list and schedulers == []
    assert isinstance(criterion, nn.MSELoss) and len(models) == 2


def test_get_test_operator_runs_custom_func_for_both_hooks():
    def custom(operator, iterator, info):
        return {"count": sum(1 for _ in iterator), "steps": info[NUM_STEPS]}

    runner = make_runner(get_test_operator(LinearOperator), {BATCH_SIZE: 500, "custom_func": custom})
    assert runner.train_epoch(num_steps=1)["count"] == 1
    assert runner.validate()["count"] == 1 and runner.validate(num_steps=3)["steps"] == 3
    plain = make_runner(get_test_operator(LinearOperator), {BATCH_SIZE: 500})
    assert plain.train_epoch()["done"] == 1


def test_train_argument_checks_run_on_the_driver():
    from test_trainer_driver import FakeWorkerGroup
    from raysgd import TorchTrainer

    FakeWorkerGroup.instances.clear()
    trainer = TorchTrainer(training_operator_cls=LinearOperator, num_workers=2,
                           _worker_group_cls=FakeWorkerGroup)
    for bad in (-1, -5, 1.5, True):
        with pytest.raises(ValueError, match="max_retries must be an integer >= 0"):
            trainer.train(max_retries=bad)
    with pytest.raises(ConfigError, match="takes a ray.data.Dataset; got a builtins.object"):
        trainer.train(dataset=object())
    assert all(call[0] != "train_epoch" for call in FakeWorkerGroup.instances[-1].calls)
    with pytest.raises(ConfigError, match="placement_strategy='RANDOM' is not valid"):
        TorchTrainer(training_operator_cls=LinearOperator, placement_strategy="RANDOM",
                     _worker_group_cls=FakeWorkerGroup)


def test_placement_errors_are_timeout_errors():
    from raysgd.errors import ResourcesUnavailableError

    assert issubclass(ResourcesUnavailableError, TimeoutError)
    assert issubclass(ResourcesUnavailableError, RuntimeError)


@pytest.mark.parametrize("name, fix", [("num_replicas", "num_workers=N"),
                                       ("batch_size", "BATCH_SIZE"),
                                       ("data_loader_args", "DataLoader")])
def test_arguments_removed_before_1_12_name_the_fix(name, fix):
    from raysgd import TorchTrainer

    with pytest.raises(ConfigError, match=f"{name}=.*removed before Ray 1.12.*{fix}"):
        TorchTrainer(training_operator_cls=LinearOperator, **{name: 4})


def test_base_torch_trainable_subclass_builds_its_trainer_with_the_legacy_hook():
    from raysgd.torch import BaseTorchTrainable

    class MyTrainable(BaseTorchTrainable):
        def _create_trainer(self, config):
            return ("trainer for", config["lr"])

    trainable = object.__new__(MyTrainable)  # Tune's own __init__ needs a cluster
    trainable.setup({"lr": 0.5})
    assert trainable.trainer == ("trainer for", 0.5)


def test_removed_restore_and_legacy_save_keyword(tmp_path):
    from test_trainer_driver import FakeWorkerGroup
    from raysgd import TorchTrainer

    trainer = TorchTrainer(training_operator_cls=LinearOperator, _worker_group_cls=FakeWorkerGroup)
    with pytest.raises(DeprecationWarning, match="load"):
        trainer.restore(str(tmp_path / "x"))
    FakeWorkerGroup.instances[-1].responses["state_dict"] = [{"models": [{}]}]
    path = trainer.save(checkpoint=str(tmp_path / "legacy.pt"))  # Ray 1.12's keyword
    trainer.load(checkpoint=path)
