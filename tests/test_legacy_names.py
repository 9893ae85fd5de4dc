"""The name table: every public module path and name of Ray 1.12's ``ray.util.sgd`` that
raysgd provides, with the prefix swapped, and the ones it deliberately does not.

Written from Ray 1.12's source (``python/ray/util/sgd/``); keep it in step with
docs/legacy.md. No Ray cluster is started here.
"""
import importlib

import pytest

PROVIDED = {
    "raysgd": ["TorchTrainer", "PyTorchTrainer"],
    "raysgd.utils": ["BATCH_COUNT", "NUM_SAMPLES", "BATCH_SIZE", "TimerStat", "TimerCollection",
                     "AverageMeter", "AverageMeterCollection", "check_for_failure", "override"],
    "raysgd.torch": ["TorchTrainer", "BaseTorchTrainable", "TrainingOperator", "CreatorOperator",
                     "TorchTrainable", "DistributedTrainableCreator", "distributed_checkpoint_dir",
                     "is_distributed_trainable"],
    "raysgd.torch.lightning_operator": ["LightningOperator"],
    "raysgd.torch.func_trainable": ["DistributedTrainableCreator", "distributed_checkpoint_dir",
                                    "distributed_checkpoint", "is_distributed_trainable",
                                    "_train_simple", "_train_check_global",
                                    "_train_validate_session"],
    "raysgd.torch.constants": ["USE_FP16", "NUM_STEPS", "SCHEDULER_STEP", "SCHEDULER_STEP_BATCH",
                               "SCHEDULER_STEP_EPOCH", "SCHEDULER_STEP_MANUAL", "NCCL_TIMEOUT_S",
                               "SGD_PLACEMENT_GROUP_TIMEOUT_S", "VALID_SCHEDULER_STEP"],
    "raysgd.torch.training_operator": ["TrainingOperator", "CreatorOperator", "amp",
                                       "get_test_operator", "get_test_metrics_operator"],
    "raysgd.torch.torch_trainer": ["TorchTrainer", "BaseTorchTrainable"],
    "raysgd.torch.worker_group": ["SGD_PLACEMENT_GROUP_TIMEOUT_S"],
    "raysgd.torch.resnet": ["ResNet18", "ResNet34", "ResNet50", "ResNet101", "ResNet152"],
    "raysgd.torch.examples.train_example": ["LinearDataset", "model_creator", "optimizer_creator",
                                            "scheduler_creator", "data_creator", "train_example"],
    "raysgd.torch.examples.tune_example": ["tune_example", "tune_example_manual",
                                           "get_custom_training_operator", "model_creator",
                                           "optimizer_creator", "data_creator",
                                           "scheduler_creator"],
    "raysgd.torch.examples.dcgan": ["train_example"],
    "raysgd.torch.examples.cifar_pytorch_example": ["train_cifar"],
    "raysgd.data": ["Dataset"],
    "raysgd.data.examples.mlp_identity": ["model_creator", "optimizer_creator", "to_mat",
                                          "dataset_creator"],
}

# Ray 1.12 modules raysgd does not provide, and why (docs/legacy.md says the same).
NOT_PROVIDED = {
    "raysgd.tf": "TensorFlow trainers: out of scope (use Ray Train's TensorflowTrainer)",
    "raysgd.v2": "re-exported ray.train's 1.x API, which Ray itself replaced",
    "raysgd.torch.torch_dataset": "built on ray.util.data, which Ray removed",
    "raysgd.torch.torch_runner": "legacy internals, never public",
    "raysgd.torch.distributed_torch_runner": "legacy internals, never public",
    "raysgd.torch.utils": "legacy internals (process-group and amp set-up helpers)",
}

LEGACY_VALUES = {
    "USE_FP16": "__use_fp16__", "NUM_STEPS": "__num_steps__", "SCHEDULER_STEP": "scheduler_step",
    "SCHEDULER_STEP_BATCH": "batch", "SCHEDULER_STEP_EPOCH": "epoch",
    "SCHEDULER_STEP_MANUAL": "manual", "VALID_SCHEDULER_STEP": {"batch", "epoch", "manual"},
}


@pytest.mark.parametrize("module", sorted(PROVIDED))
def test_every_provided_legacy_name_resolves(module):
    imported = importlib.import_module(module)
    missing = [name for name in PROVIDED[module] if not hasattr(imported, name)]
    assert missing == [], f"{module} lacks {missing}"


@pytest.mark.parametrize("module", sorted(NOT_PROVIDED))
def test_modules_left_out_stay_out(module):
    # If one of these appears, move it to PROVIDED and document it.
    with pytest.raises(ImportError):
        importlib.import_module(module)


def test_constants_have_the_legacy_values(monkeypatch):
    from raysgd.torch import constants
    from raysgd.utils import BATCH_COUNT, BATCH_SIZE, NUM_SAMPLES

    for name, value in LEGACY_VALUES.items():
        assert getattr(constants, name) == value, name
    assert (constants.NCCL_TIMEOUT_S, constants.SGD_PLACEMENT_GROUP_TIMEOUT_S) == (1800, 100)
    assert (BATCH_SIZE, NUM_SAMPLES, BATCH_COUNT) == ("*batch_size", "num_samples", "batch_count")


def test_one_implementation_behind_each_legacy_face():
    import raysgd
    from raysgd.torch import torch_trainer, training_operator
    import raysgd.torch

    assert raysgd.TorchTrainer is raysgd.torch.TorchTrainer is torch_trainer.TorchTrainer
    assert training_operator.TrainingOperator is raysgd.torch.TrainingOperator
    assert training_operator.CreatorOperator is raysgd.torch.CreatorOperator
    assert raysgd.torch.TorchTrainable is raysgd.torch.BaseTorchTrainable
    assert torch_trainer.BaseTorchTrainable is raysgd.torch.BaseTorchTrainable
    import raysgd.function.session
    import raysgd.function.trainable
    from raysgd.torch import func_trainable

    assert raysgd.torch.DistributedTrainableCreator is func_trainable.DistributedTrainableCreator \
        is raysgd.function.trainable.DistributedTrainableCreator
    assert raysgd.torch.distributed_checkpoint_dir is raysgd.function.session.distributed_checkpoint_dir
    assert raysgd.torch.is_distributed_trainable is raysgd.function.session.is_distributed_trainable


def test_lightning_operator_face():
    pytest.importorskip("pytorch_lightning", reason="Lightning is not installed (raysgd[lightning])")
    import raysgd.lightning
    from raysgd.torch import lightning_operator

    assert lightning_operator.LightningOperator is raysgd.lightning.LightningOperator


def test_amp_is_apex_or_none():
    from raysgd.torch.training_operator import amp

    try:
        from apex import amp as apex_amp
    except ImportError:
        apex_amp = None
    assert amp is apex_amp


def test_names_left_out_fail_with_a_reason():
    import raysgd
    import raysgd.data
    from raysgd.data.examples import mlp_identity
    from raysgd.errors import ConfigError

    with pytest.raises(ImportError, match="PyTorch API only.*TensorflowTrainer"):
        from raysgd import TFTrainer  # noqa: F401
    with pytest.raises(DeprecationWarning, match="TorchTrainer"):
        raysgd.PyTorchTrainer(num_workers=1)
    dataset = mlp_identity.dataset_creator()  # now streamed through Ray Data
    assert (len(dataset.items), dataset.batch_size) == (6400, 32)
    with pytest.raises(ConfigError, match="ParallelIterator is gone"):
        raysgd.data.Dataset("not a list")
    assert mlp_identity.model_creator({})(mlp_identity.to_mat(0.5)).shape == (1, 1)


def test_timer_stat_keeps_a_window_and_the_totals():
    from raysgd.utils import TimerStat

    timer = TimerStat(window_size=2)
    for delta in (1.0, 2.0, 4.0):
        timer.push(delta)
        timer.push_units_processed(2)
    assert timer.mean == 3.0 and timer.median == 3.0 and timer.max == 4.0
    assert (timer.first, timer.last, timer.size, timer.count) == (2.0, 4.0, 2, 3)
    assert timer.mean_units_processed == 2.0 and timer.mean_throughput == pytest.approx(4 / 6)
    with timer:
        pass
    assert timer.count == 4
    timer.reset()
    assert (timer.count, timer.size, timer.first) == (0, 0, None)

    unbounded = TimerStat(window_size=None)  # the runner's profile: a mean over every sample
    for delta in (1.0, 2.0, 6.0):
        unbounded.push(delta)
    assert unbounded.mean == 3.0 and unbounded.sum == 9.0


def test_timer_collection_record_stats_and_disable():
    from raysgd.utils import TimerCollection

    timers = TimerCollection()
    with timers.record("fwd"):
        pass
    timers.record("fwd").push(1.0)
    timers.record("never")  # a timer with no samples is left out of stats
    stats = timers.stats(mean=True, last=True)
    assert set(stats) == {"mean_fwd_s", "last_fwd_s"} and stats["last_fwd_s"] == 1.0
    assert set(timers.stats()) == {"mean_fwd_s"}
    timers.disable()
    with timers.record("off"):
        pass
    assert "mean_off_s" not in timers.stats()
    timers.enable()
    timers.reset()
    assert timers.stats() == {}


def test_override_and_check_for_failure_without_refs():
    from raysgd.torch import TrainingOperator
    from raysgd.utils import check_for_failure, override

    assert check_for_failure([]) is True

    class Op(TrainingOperator):
        @override(TrainingOperator)
        def validate(self, iterator, info=None):
            return {}

    with pytest.raises(NameError):
        override(TrainingOperator)(lambda self: None)
