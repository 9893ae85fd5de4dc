"""Legacy ``ray.util.sgd.torch.constants``, with Ray 1.12's names and values."""
from raysgd.constants import (NCCL_TIMEOUT_S, NUM_STEPS, SCHEDULER_STEP, SCHEDULER_STEP_BATCH,
                              SCHEDULER_STEP_EPOCH, SCHEDULER_STEP_MANUAL,
                              SGD_PLACEMENT_GROUP_TIMEOUT_S, USE_FP16, VALID_SCHEDULER_STEP)

__all__ = ["USE_FP16", "NUM_STEPS", "SCHEDULER_STEP", "SCHEDULER_STEP_BATCH",
           "SCHEDULER_STEP_EPOCH", "SCHEDULER_STEP_MANUAL", "NCCL_TIMEOUT_S",
           "SGD_PLACEMENT_GROUP_TIMEOUT_S", "VALID_SCHEDULER_STEP"]
