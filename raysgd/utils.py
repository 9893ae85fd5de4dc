"""Legacy ``ray.util.sgd.utils`` names: constants, meters, timers and small helpers."""
from raysgd.constants import BATCH_SIZE
from raysgd.driver.report import pretty_print
from raysgd.driver.watch import check_for_failure
from raysgd.worker.batches import move_to_device
from raysgd.worker.metrics import BATCH_COUNT, NUM_SAMPLES, AverageMeter, AverageMeterCollection
from raysgd.worker.timers import TimerCollection, TimerStat


def override(interface_class):
    """Decorator asserting that a method overrides one of ``interface_class``."""

    def check(method):
        if method.__name__ not in dir(interface_class):
            raise NameError(f"{method.__name__} does not override any method of "
                            f"{interface_class.__name__}")
        return method

    return check


__all__ = ["BATCH_SIZE", "NUM_SAMPLES", "BATCH_COUNT", "AverageMeter",
           "AverageMeterCollection", "TimerStat", "TimerCollection", "check_for_failure",
           "override", "move_to_device", "pretty_print"]
