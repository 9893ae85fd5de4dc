"""Legacy ``ray.util.sgd.torch`` names."""
from raysgd.creator_operator import CreatorOperator
from raysgd.operator import TrainingOperator
from raysgd.trainer import TorchTrainer

__all__ = ["TorchTrainer", "TrainingOperator", "BaseTorchTrainable", "CreatorOperator"]


def __getattr__(name):
    # Ray Tune is heavy and optional: import it only when the trainable is asked for.
    if name == "BaseTorchTrainable":
        from raysgd.tune import BaseTorchTrainable

        return BaseTorchTrainable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
