"""Legacy ``ray.util.sgd.torch`` names."""
from raysgd.creator_operator import CreatorOperator
from raysgd.operator import TrainingOperator
from raysgd.trainer import TorchTrainer
from raysgd.tune import BaseTorchTrainable

__all__ = ["TorchTrainer", "TrainingOperator", "BaseTorchTrainable", "CreatorOperator"]
