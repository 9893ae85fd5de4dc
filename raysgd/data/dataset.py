"""Legacy ``ray.util.sgd.data.dataset.Dataset`` (see :mod:`raysgd.data`)."""
from raysgd.errors import ConfigError


class Dataset:
    """Ray 1.12's ``ray.util.iter``-based dataset; constructing one raises :class:`ConfigError`."""

    def __init__(self, data=None, batch_size=32, download_func=None, max_concurrency=0,
                 transform=None):
        raise ConfigError(
            "raysgd.data.Dataset (legacy ray.util.sgd.data.Dataset) streamed through "
            "ray.util.iter, which Ray removed in 2.0, so it cannot be built. Wrap the data in a "
            "torch.utils.data.DataLoader and register it in your operator's setup() with "
            "self.register_data(train_loader=...); TorchTrainer adds a DistributedSampler.")
