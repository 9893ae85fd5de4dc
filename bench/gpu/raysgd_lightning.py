"""Variant: a LightningModule through ``TrainingOperator.from_ptl`` in raysgd
``TorchTrainer(num_workers=1, use_local=True, use_fp16=...)`` (a diagnosis: what the
Lightning adapter's step costs beside raysgd's own ``train_batch``).
"""
from __future__ import annotations

from raysgd.torch import TrainingOperator

from bench.gpu.lightning_module import PoolModule
from bench.gpu.raysgd_amp import run

if __name__ == "__main__":
    run(__doc__, TrainingOperator.from_ptl(PoolModule))
