"""raysgd: the RaySGD operator API (``TorchTrainer`` + ``TrainingOperator``) on Ray 2.x.

Legacy scripts run after replacing ``ray.util.sgd`` with ``raysgd`` in imports.

The public names load on first use (PEP 562): a worker process imports only the
modules it runs, so a warm spare can do its heavy imports (torch, the operator's
module) in a low-priority thread instead of while Ray loads its actor class.
"""
import importlib
from typing import TYPE_CHECKING

from raysgd.errors import (CheckpointError, ConfigError, RaySGDError, ResourcesUnavailableError,
                           TrainerShutdownError, WorkerFailedError)

if TYPE_CHECKING:  # what type checkers and IDEs resolve the lazy names to
    from raysgd.data.dataset_config import DatasetConfig
    from raysgd.driver.warm import idle_workers, release_idle_workers
    from raysgd.operator import TrainingOperator
    from raysgd.strategy import DDP, FSDP
    from raysgd.trainer import TorchTrainer

__version__ = "0.1.0"

__all__ = ["TorchTrainer", "TrainingOperator", "DatasetConfig", "FSDP", "DDP", "RaySGDError", "ConfigError", "CheckpointError",
           "TrainerShutdownError", "WorkerFailedError", "ResourcesUnavailableError",
           "idle_workers", "release_idle_workers", "PyTorchTrainer"]

# Public name -> the module that defines it, imported on first access.
_LAZY = {"TorchTrainer": "raysgd.trainer", "TrainingOperator": "raysgd.operator",
         "DatasetConfig": "raysgd.data.dataset_config", "idle_workers": "raysgd.driver.warm",
         "release_idle_workers": "raysgd.driver.warm", "FSDP": "raysgd.strategy",
         "DDP": "raysgd.strategy"}


def PyTorchTrainer(**kwargs):
    """The pre-1.0 name; legacy raised this too."""
    raise DeprecationWarning("PyTorchTrainer was renamed TorchTrainer: use "
                             "`from raysgd import TorchTrainer`.")


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    # An ImportError so that `from raysgd import TFTrainer` shows why.
    if name in ("TFTrainer", "TFTrainable"):
        raise ImportError(f"raysgd rebuilds ray.util.sgd's PyTorch API only; {name} (TensorFlow) is "
                          "not part of it. Use ray.train.tensorflow.TensorflowTrainer instead.")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
