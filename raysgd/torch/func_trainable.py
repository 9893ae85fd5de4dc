"""Legacy ``ray.util.sgd.torch.func_trainable`` (Ray 1.0-1.12: ``ray.tune.integration.torch``):
function trainables on N DDP workers. The implementation is :mod:`raysgd.function.trainable`
(driver) and :mod:`raysgd.function.session` (workers); ``_train_simple`` and
``_train_check_global`` and ``_train_validate_session`` are the helpers Ray's own tests
imported from here."""
from raysgd.function.session import (distributed_checkpoint, distributed_checkpoint_dir,
                                 is_distributed_trainable)
from raysgd.function.trainable import DistributedTrainableCreator
from raysgd.torch.examples.func_trainable_example import train_check_global as _train_check_global
from raysgd.torch.examples.func_trainable_example import train_simple as _train_simple
from raysgd.torch.examples.func_trainable_example import \
    train_validate_session as _train_validate_session

__all__ = ["DistributedTrainableCreator", "distributed_checkpoint_dir", "distributed_checkpoint",
           "is_distributed_trainable", "_train_simple", "_train_check_global",
           "_train_validate_session"]
