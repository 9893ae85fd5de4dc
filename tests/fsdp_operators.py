"""Operators for the FSDP tests (workers import this module by name)."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from operators_for_tests import record_pid
from raysgd import TrainingOperator
from raysgd.utils import BATCH_SIZE


class Block(nn.Module):
    """A residual MLP block: the FSDP shard unit of the tests."""

    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


def stack(width, depth):
    return nn.Sequential(*[Block(width) for _ in range(depth)], nn.Linear(width, 1))


def peak_rss_reset():
    """Reset this process's peak RSS (VmHWM) and return the current RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return _status("VmRSS")


def _status(field):
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _warm_up_fsdp(world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        tiny = Block(8)
    fully_shard(tiny, mesh=init_device_mesh("cpu", (world_size,)))
    tiny.to_empty(device="cpu")
    tiny.fc.reset_parameters()


class StackOperator(TrainingOperator):
    """Residual blocks on regression data; ``config['meta']`` builds the model on the meta
    device and records how much the process's peak memory grew while it was registered."""

    def setup(self, config):
        torch.manual_seed(0)
        width, depth = config.get("width", 16), config.get("depth", 3)
        g = torch.Generator().manual_seed(1)
        x = torch.randn(config.get("data_size", 256), width, generator=g)
        y = x.sum(dim=1, keepdim=True).tanh()
        if config.get("meta"):
            _warm_up_fsdp(self.world_size)  # its one-off library set-up is not the model's
            with torch.device("meta"):
                model = stack(width, depth)
        else:
            model = stack(width, depth)
        optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-3))
        before = peak_rss_reset()
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=optimizer, criterion=nn.MSELoss())
        self.register_growth = _status("VmHWM") - before
        self.register_data(
            train_loader=DataLoader(TensorDataset(x, y), batch_size=config[BATCH_SIZE]),
            validation_loader=DataLoader(TensorDataset(x, y), batch_size=64))
        record_pid(config, self.world_rank)

    def train_batch(self, batch, batch_info):
        if self.config.get("sleep_s"):
            import time

            time.sleep(self.config["sleep_s"])
        return super().train_batch(batch, batch_info)
