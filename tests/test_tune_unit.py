"""The Tune trainable's pure parts: resource shapes, result merging, argument checks,
the trial swap of reuse_actors."""
from types import SimpleNamespace

import pytest

from operators_for_tests import LinearOperator
from raysgd import TorchTrainer
from raysgd.errors import ConfigError
from raysgd.tune import _merge_results
from raysgd.utils import BATCH_SIZE


def bundles(trainable, config=None):
    return trainable.default_resource_request(config or {}).bundles


def test_a_driver_bundle_then_one_bundle_per_worker():
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=2,
                                          num_cpus_per_worker=2, use_gpu=False)
    assert bundles(trainable) == [{"CPU": 1.0}, {"CPU": 2.0}, {"CPU": 2.0}]


def test_the_trial_config_overrides_the_kwargs_and_use_local_makes_rank_0_the_head():
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=2,
                                          use_gpu=False)
    assert bundles(trainable, {"num_workers": 3, "use_local": True}) == [{"CPU": 1.0}] * 3
    assert bundles(trainable, {"use_gpu": True}) == [{"CPU": 1.0}] + [{"CPU": 1.0, "GPU": 1.0}] * 2
    assert bundles(trainable, {"use_gpu": True, "num_gpus_per_worker": 2}) == \
        [{"CPU": 1.0}] + [{"CPU": 1.0, "GPU": 2.0}] * 2


def test_num_workers_per_host_asks_tune_for_one_bundle_per_host():
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=4,
                                          use_gpu=False, num_workers_per_host=2)
    request = trainable.default_resource_request({})
    assert request.bundles == [{"CPU": 1.0}, {"CPU": 2.0}, {"CPU": 2.0}]
    assert request.strategy == "STRICT_SPREAD"


def test_use_gpu_absent_means_no_gpu_without_a_cluster_that_has_them():
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator)
    assert bundles(trainable) == [{"CPU": 1.0}, {"CPU": 1.0}]


def test_validation_keys_never_overwrite_training_keys():
    merged = _merge_results({"num_samples": 1000, "batch_count": 10, "train_loss": 1.0},
                            {"num_samples": 400, "batch_count": 4, "val_loss": 2.0})
    assert merged == {"num_samples": 1000, "batch_count": 10, "train_loss": 1.0,
                      "val_num_samples": 400, "val_batch_count": 4, "val_loss": 2.0}


def half(trainer, info):
    return 0.5


def test_an_override_tune_step_that_returns_no_dict_is_named():
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator,
                                          override_tune_step=half)
    trial = trainable.__new__(trainable)  # the step alone, without Tune's actor set-up
    trial._trainer, trial._iteration = None, 0
    with pytest.raises(ConfigError, match=r"override_tune_step half returned float \(0\.5\); "
                                          r"it must return a dict of metrics for Tune"):
        trial.step()


def test_override_tune_step_must_take_trainer_and_info():
    TorchTrainer.as_trainable(training_operator_cls=LinearOperator,
                              override_tune_step=lambda trainer, info: {})
    for bad in (lambda trainer: {}, lambda trainer, info, extra: {}, lambda *args: {}, 3):
        with pytest.raises(ConfigError, match="override_tune_step"):
            TorchTrainer.as_trainable(training_operator_cls=LinearOperator, override_tune_step=bad)


# ------------------------------------------------- reuse_actors: reset_config
class FakeTrainer:
    """Records how the trainable built it; ``save`` writes a file."""

    def __init__(self, *args, config=None, _reservation=None, **kwargs):
        self.config, self.reservation, self.kwargs = config, _reservation, kwargs
        self.shut_down = False

    def shutdown(self):
        self.shut_down = True

    def save(self, path):
        with open(path, "w") as handle:
            handle.write("state")


def fake_trainable(monkeypatch, bundles=3, **kwargs):
    """A trainable of FakeTrainer, made without Tune's __init__, in a fake placement group."""
    import raysgd.tune

    group = SimpleNamespace(bundle_specs=[{"CPU": 1.0}] * bundles)
    monkeypatch.setattr(raysgd.tune, "get_current_placement_group", lambda: group)
    cls = raysgd.tune.as_trainable(FakeTrainer, num_workers=2, use_gpu=False, **kwargs)
    return cls.__new__(cls), group


def test_reset_config_shuts_the_old_trainer_down_and_builds_one_for_the_new_trial(monkeypatch):
    trainable, group = fake_trainable(monkeypatch, config={BATCH_SIZE: 64})
    trainable.setup({"lr": 0.1, "momentum": 0.9})
    first = trainable.trainer
    trainable._last_result = {"training_iteration": 3, "loss": 1.0}
    assert trainable.reset_config({"lr": 0.01}) is True
    assert first.shut_down and not trainable.trainer.shut_down
    # Only the new trial's config on top of the shared one: nothing of the old trial's.
    assert trainable.trainer.config == {BATCH_SIZE: 64, "lr": 0.01}
    assert trainable._trial_config == {"lr": 0.01}
    assert trainable._last_result is None
    reservation = trainable.trainer.reservation
    assert (reservation.group, reservation.first_bundle, reservation.size) == (group, 1, 2)


def test_reset_config_takes_new_resource_keys_that_need_the_same_placement_group(monkeypatch):
    trainable, _ = fake_trainable(monkeypatch)
    trainable.setup({"use_local": True, "num_workers": 3})  # rank 0 is the trainable
    assert trainable.reset_config({"num_workers": 2}) is True  # the same three CPU bundles
    assert trainable.trainer.kwargs["num_workers"] == 2
    assert trainable.trainer.kwargs["use_local"] is False


def test_reset_config_refuses_a_trial_that_needs_another_placement_group(monkeypatch):
    trainable, _ = fake_trainable(monkeypatch)
    trainable.setup({"lr": 0.1})
    first = trainable.trainer
    assert trainable.reset_config({"lr": 0.01, "num_workers": 3}) is False
    assert trainable.reset_config({"lr": 0.01, "num_cpus_per_worker": 2}) is False
    # Left as it was: Tune stops this actor, and cleanup() shuts the trainer down.
    assert trainable.trainer is first and not first.shut_down
    assert trainable._trial_config == {"lr": 0.1}


def test_reset_config_goes_through_a_subclass_create_trainer(monkeypatch):
    import raysgd.tune

    made = []

    class Legacy(raysgd.tune.BaseTorchTrainable):
        def _create_trainer(self, config):
            made.append(FakeTrainer(config=config))
            return made[-1]

    monkeypatch.setattr(raysgd.tune, "get_current_placement_group", lambda: None)
    trainable = Legacy.__new__(Legacy)
    trainable.setup({"lr": 0.1})
    assert trainable.reset_config({"lr": 0.01}) is True
    assert [t.config for t in made] == [{"lr": 0.1}, {"lr": 0.01}]
    assert made[0].shut_down and trainable.trainer is made[1]


def test_after_a_reset_the_previous_trials_checkpoint_counts_as_another_trials(monkeypatch,
                                                                               tmp_path):
    trainable, _ = fake_trainable(monkeypatch)
    trainable.setup({"lr": 0.1})
    (tmp_path / "old").mkdir()
    trainable.save_checkpoint(str(tmp_path / "old"))
    assert not trainable._from_other_trial(str(tmp_path / "old"))
    trainable.reset_config({"lr": 0.01})
    (tmp_path / "new").mkdir()
    trainable.save_checkpoint(str(tmp_path / "new"))
    assert trainable._from_other_trial(str(tmp_path / "old"))  # PBT keeps the new lr
    assert not trainable._from_other_trial(str(tmp_path / "new"))
