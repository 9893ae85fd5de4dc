"""Legacy ``ray.util.sgd.torch.lightning_operator``: ``LightningOperator`` from raysgd.lightning."""
from raysgd.lightning import LightningOperator

__all__ = ["LightningOperator"]
