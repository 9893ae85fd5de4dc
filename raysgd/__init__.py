"""raysgd: the RaySGD operator API (``TorchTrainer`` + ``TrainingOperator``) on Ray 2.x.

Legacy scripts run after replacing ``ray.util.sgd`` with ``raysgd`` in imports.
"""
from raysgd.data.dataset_config import DatasetConfig
from raysgd.driver.warm import idle_workers, release_idle_workers
from raysgd.errors import (CheckpointError, ConfigError, RaySGDError, ResourcesUnavailableError,
                           TrainerShutdownError, WorkerFailedError)
from raysgd.operator import TrainingOperator
from raysgd.trainer import TorchTrainer

__version__ = "0.1.0"

__all__ = ["TorchTrainer", "TrainingOperator", "DatasetConfig", "RaySGDError", "ConfigError", "CheckpointError",
           "TrainerShutdownError", "WorkerFailedError", "ResourcesUnavailableError",
           "idle_workers", "release_idle_workers", "PyTorchTrainer"]


def PyTorchTrainer(**kwargs):
    """The pre-1.0 name; legacy raised this too."""
    raise DeprecationWarning("PyTorchTrainer was renamed TorchTrainer: use "
                             "`from raysgd import TorchTrainer`.")


def __getattr__(name):
    # An ImportError so that `from raysgd import TFTrainer` shows why.
    if name in ("TFTrainer", "TFTrainable"):
        raise ImportError(f"raysgd rebuilds ray.util.sgd's PyTorch API only; {name} (TensorFlow) is "
                          "not part of it. Use ray.train.tensorflow.TensorflowTrainer instead.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
