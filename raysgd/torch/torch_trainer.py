"""Legacy ``ray.util.sgd.torch.torch_trainer``: ``TorchTrainer`` and ``BaseTorchTrainable``."""
from raysgd.trainer import TorchTrainer

__all__ = ["TorchTrainer", "BaseTorchTrainable"]


def __getattr__(name):
    # Ray Tune is heavy and optional: import it only when the trainable is asked for.
    if name == "BaseTorchTrainable":
        from raysgd.tune import BaseTorchTrainable

        return BaseTorchTrainable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
