"""Legacy ``ray.util.sgd.torch.worker_group``: only its public constant.

The worker group itself is :mod:`raysgd.driver.worker_group`. The placement timeout is
``TorchTrainer(placement_timeout_s=...)``, defaulting to the
``SGD_PLACEMENT_GROUP_TIMEOUT_S`` environment variable (else 100 s), read when a
trainer is built; assigning this module attribute changes nothing.
"""
from raysgd.constants import SGD_PLACEMENT_GROUP_TIMEOUT_S

__all__ = ["SGD_PLACEMENT_GROUP_TIMEOUT_S"]
