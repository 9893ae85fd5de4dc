"""Legacy ``ray.util.sgd.data.examples.mlp_identity``: learn ``f(x) = x`` with a small MLP.

The creators work as they did; ``dataset_creator`` builds the legacy
:class:`raysgd.data.Dataset`, now streamed through Ray Data.
"""
import torch
from torch import nn
from torch.nn import functional as F

from raysgd.data.dataset import Dataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(1, 128)
        self.fc2 = nn.Linear(128, 1)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def model_creator(config):
    return Net()


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-4))


def to_mat(x):
    """``x`` as a 1x1 float tensor."""
    return torch.tensor([[x]]).float()


def dataset_creator():
    """The legacy streaming dataset of 6,400 points in [0, 1), in batches of 32 per worker."""
    num_points = 32 * 100 * 2
    data = [i / num_points for i in range(num_points)]
    return Dataset(data, batch_size=32, max_concurrency=2,
                   download_func=lambda x: (to_mat(x), to_mat(x)))
