"""Legacy ``ray.util.sgd.data``: importable, but its ``Dataset`` cannot be built.

Ray 1.12's ``Dataset`` streamed batches through ``ray.util.iter``, which Ray
removed in 2.0; there is nothing left to build it on. Register a ``DataLoader``
with ``self.register_data(train_loader=...)`` instead.
"""
from raysgd.data.dataset import Dataset

__all__ = ["Dataset"]
