"""``self.trainer`` for a LightningModule trained by raysgd: a stand-in, not a Lightning Trainer.

It answers what has a faithful raysgd meaning (epoch, step, ranks, optimizers,
schedulers, loaders, the phase flags) from the operator, and raises
:class:`TrainerAttributeError` naming the attribute and what to use instead
for everything else, rather than failing somewhere inside Lightning.
"""
from __future__ import annotations

import math
from typing import Any

from raysgd.lightning.errors import TrainerAttributeError

PRECISION_NAMES = {"fp32": "32-true", "bfloat16": "bf16-mixed", "float16": "16-mixed",
                   "apex": "16-mixed"}

# Attributes with no raysgd counterpart, and what to use instead.
HINTS = {
    "strategy": "raysgd owns DistributedDataParallel; use self.all_gather(...), "
                "torch.distributed, or the operator's helpers",
    "estimated_stepping_batches": "raysgd has no max_epochs (the driver calls train() as often as "
                                  "it likes); pass the total number of steps in config",
    "fit_loop": "the driver's loop over trainer.train() is the fit loop",
    "should_stop": "the driver decides when to stop: stop calling trainer.train()",
    "log_dir": "raysgd has no Lightning logger; write files yourself or use trainer.save(path)",
    "default_root_dir": "raysgd has no root dir; use trainer.save(path) on the driver",
    "checkpoint_callback": "use trainer.save(path) / trainer.load(path) on the driver",
    "save_checkpoint": "use trainer.save(path) on the driver; on_save_checkpoint is called then",
    "precision_plugin": "precision comes from TorchTrainer(use_fp16=...); use "
                        "self.manual_backward and opt.step(), which apply it",
    "accelerator": "raysgd picks the device (TorchTrainer(use_gpu=...)); use self.device",
    "num_nodes": "raysgd places workers with Ray; use self.trainer.world_size",
    "logged_metrics": "use self.trainer.callback_metrics",
}


def _hint(name: str) -> str:
    return HINTS.get(name, "this Trainer feature has no raysgd counterpart; see "
                           "raysgd.lightning.trainer_stub.TrainerStub for what is available")


class TrainerStub:
    """Read-only view of one operator, shaped like the Lightning Trainer attributes modules use."""

    max_epochs = None       # the driver decides how many train() calls to make
    min_epochs = None
    max_steps = -1
    min_steps = None
    num_devices = 1         # one device per worker process
    barebones = False
    fast_dev_run = False
    sanity_checking = False
    testing = False
    predicting = False
    logger = None
    progress_bar_callback = None

    def __init__(self, operator: Any):
        object.__setattr__(self, "_op", operator)

    def __setattr__(self, name: str, value: Any) -> None:
        raise TrainerAttributeError(f"self.trainer.{name} cannot be set when raysgd trains the "
                                    f"module: {_hint(name)}.")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise TrainerAttributeError(
            f"self.trainer.{name} is not available when raysgd trains a LightningModule (there "
            f"is no Lightning Trainer): {_hint(name)}.")

    # ------------------------------------------------------------- progress
    @property
    def current_epoch(self) -> int:
        return self._op.current_epoch

    @property
    def global_step(self) -> int:
        return self._op.global_step

    # ---------------------------------------------------------------- ranks
    @property
    def world_size(self) -> int:
        return self._op.world_size

    @property
    def global_rank(self) -> int:
        return self._op.world_rank

    @property
    def local_rank(self) -> int:
        return self._op.local_rank

    @property
    def is_global_zero(self) -> bool:
        return self._op.world_rank == 0

    # ------------------------------------------------------------ components
    @property
    def lightning_module(self):
        return self._op.get_model()

    @property
    def model(self):
        """The module as trained: DDP around the step dispatcher when distributed."""
        return self._op._models[0] if self._op._models else self._op.get_model()

    @property
    def optimizers(self) -> list:
        return list(self._op._optimizers)

    @property
    def lr_scheduler_configs(self) -> list:
        return list(self._op.scheduler_specs)

    @property
    def datamodule(self):
        return self._op.datamodule

    @property
    def callbacks(self) -> list:
        return []

    @property
    def loggers(self) -> list:
        return []

    @property
    def callback_metrics(self) -> dict:
        return dict(self._op.callback_metrics)

    # ---------------------------------------------------------------- state
    @property
    def training(self) -> bool:
        return self._op.phase == "train"

    @property
    def validating(self) -> bool:
        return self._op.phase == "validate"

    @property
    def precision(self) -> str:
        return PRECISION_NAMES.get(self._op._context.precision.name, "32-true")

    @property
    def accumulate_grad_batches(self) -> int:
        """1: raysgd steps the optimizer once per batch. ``accumulate_steps=k`` splits each
        batch into k micro-batches inside that one step, so no batch is ever accumulated."""
        return 1

    @property
    def gradient_clip_val(self):
        return self._op._context.settings.clip_grad_norm

    @property
    def gradient_clip_algorithm(self):
        return "norm" if self._op._context.settings.clip_grad_norm is not None else None

    # ----------------------------------------------------------------- data
    @property
    def train_dataloader(self):
        return self._op.train_loader

    @property
    def val_dataloaders(self):
        return self._op.validation_loader

    @property
    def num_training_batches(self):
        return _length(self._op.train_loader)

    @property
    def num_val_batches(self) -> list:
        loader = self._op.validation_loader
        return [] if loader is None else [_length(loader)]


def _length(loader: Any):
    try:
        return len(loader)
    except TypeError:
        return math.inf
