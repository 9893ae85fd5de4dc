"""The Tune trainable's pure parts: resource shapes, result merging, argument checks."""
import pytest

from operators_for_tests import LinearOperator
from raysgd import TorchTrainer
from raysgd.errors import ConfigError
from raysgd.tune import _merge_results


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


def test_override_tune_step_must_take_trainer_and_info():
    TorchTrainer.as_trainable(training_operator_cls=LinearOperator,
                              override_tune_step=lambda trainer, info: {})
    for bad in (lambda trainer: {}, lambda trainer, info, extra: {}, lambda *args: {}, 3):
        with pytest.raises(ConfigError, match="override_tune_step"):
            TorchTrainer.as_trainable(training_operator_cls=LinearOperator, override_tune_step=bad)
