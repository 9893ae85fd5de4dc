"""Legacy ``ray.util.sgd.utils`` names."""
from raysgd.batches import move_to_device
from raysgd.metrics import BATCH_COUNT, NUM_SAMPLES, AverageMeter, AverageMeterCollection
from raysgd.report import pretty_print

BATCH_SIZE = "*batch_size"


def override(interface_class):
    """Decorator asserting that a method overrides one of ``interface_class``."""

    def check(method):
        if method.__name__ not in dir(interface_class):
            raise NameError(f"{method.__name__} does not override any method of "
                            f"{interface_class.__name__}")
        return method

    return check


__all__ = ["BATCH_SIZE", "NUM_SAMPLES", "BATCH_COUNT", "AverageMeter",
           "AverageMeterCollection", "override", "move_to_device",
           "pretty_print"]
