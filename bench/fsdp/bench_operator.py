"""The raysgd operator of the FSDP benchmark (a module of ``bench`` so workers import it)."""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

from raysgd import TrainingOperator
from raysgd.utils import BATCH_SIZE

from bench.fsdp.model import SIZES, reset_peak, status_bytes


class FSDPBenchOperator(TrainingOperator):
    """Builds the model, records the RSS before it (``baseline``); ``peak_growth()`` is the
    most this process held above that since."""

    def setup(self, config):
        size = SIZES[config["mode"]]
        self.baseline = reset_peak()
        model = size.model()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        self.register(models=model, optimizers=optimizer, criterion=nn.MSELoss())
        self.register_data(train_loader=DataLoader(size.data(), batch_size=config[BATCH_SIZE]))

    def peak_growth(self) -> int:
        return status_bytes("VmHWM") - self.baseline

    def gpu_peak_mib(self):
        """The most GPU memory torch allocated in this process (None without CUDA)."""
        return torch.cuda.max_memory_allocated() / 2**20 if self.device.type == "cuda" else None
