"""Legacy ``ray.util.sgd.torch`` names."""
from raysgd.creator_operator import CreatorOperator
from raysgd.operator import TrainingOperator
from raysgd.torch import torch_trainer as _torch_trainer
from raysgd.trainer import TorchTrainer

__all__ = ["TorchTrainer", "TrainingOperator", "BaseTorchTrainable", "CreatorOperator",
           "TorchTrainable", "DistributedTrainableCreator", "distributed_checkpoint_dir",
           "is_distributed_trainable"]
_FUNCTION_TRAINABLE = ("DistributedTrainableCreator", "distributed_checkpoint_dir",
                       "is_distributed_trainable")


def __getattr__(name):
    # ``TorchTrainable`` is the Ray 0.8 name of ``BaseTorchTrainable``, still found in
    # scripts; both import Ray Tune only when asked for (see torch_trainer).
    if name in ("BaseTorchTrainable", "TorchTrainable"):
        return _torch_trainer.BaseTorchTrainable
    if name in _FUNCTION_TRAINABLE:  # as Ray 0.8 exported them; they import Ray Tune too
        from raysgd.torch import func_trainable

        return getattr(func_trainable, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
