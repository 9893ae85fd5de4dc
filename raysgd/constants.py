"""Names and values shared by the driver, the workers and user code.

These are Ray 1.12's ``ray.util.sgd`` constants with their legacy values
(``raysgd.torch.constants`` and ``raysgd.utils`` re-export them): the
``info`` keys every ``train_epoch``/``validate`` call receives, the
``scheduler_step_freq`` choices, and the two environment knobs.
"""
from __future__ import annotations

import os

from raysgd.errors import ConfigError

# The global batch size key of ``config`` (split among workers).
BATCH_SIZE = "*batch_size"

# Keys of the ``info`` dict passed to ``train_epoch`` and ``validate``.
USE_FP16 = "__use_fp16__"
NUM_STEPS = "__num_steps__"
SCHEDULER_STEP = "scheduler_step"
EPOCH_IDX = "epoch_idx"

SCHEDULER_STEP_BATCH = "batch"
SCHEDULER_STEP_EPOCH = "epoch"
SCHEDULER_STEP_MANUAL = "manual"
VALID_SCHEDULER_STEP = {SCHEDULER_STEP_BATCH, SCHEDULER_STEP_EPOCH, SCHEDULER_STEP_MANUAL}


def env_seconds(name: str, default: float) -> float:
    """A number of seconds from the environment variable ``name``, or ``default``."""
    raw = os.environ.get(name)
    try:
        return float(raw) if raw else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number of seconds.") from None


# Legacy read these once at import; TorchTrainer reads the environment again
# each time one is built, so setting the variable later still takes effect.
NCCL_TIMEOUT_S = int(env_seconds("NCCL_TIMEOUT_S", 1800))
SGD_PLACEMENT_GROUP_TIMEOUT_S = int(env_seconds("SGD_PLACEMENT_GROUP_TIMEOUT_S", 100))
