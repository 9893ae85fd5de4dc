"""raysgd: the RaySGD operator API (``TorchTrainer`` + ``TrainingOperator``) on Ray 2.x.

Legacy scripts run after replacing ``ray.util.sgd`` with ``raysgd`` in imports.
"""
from raysgd.errors import (CheckpointError, ConfigError, RaySGDError, ResourcesUnavailableError,
                           TrainerShutdownError, WorkerFailedError)
from raysgd.operator import TrainingOperator
from raysgd.trainer import TorchTrainer

__version__ = "0.1.0"

__all__ = ["TorchTrainer", "TrainingOperator", "RaySGDError", "ConfigError", "CheckpointError",
           "TrainerShutdownError", "WorkerFailedError", "ResourcesUnavailableError"]
