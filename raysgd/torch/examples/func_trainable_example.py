"""A plain DDP training function under Ray Tune, on 2 workers per trial.

``train_digits(config, checkpoint_dir=None)`` is ordinary PyTorch: it builds a model,
wraps it in ``DistributedDataParallel`` (the process group is already initialised),
shards the digits with a ``DistributedSampler``, reports once per epoch with
``tune.report`` and writes a checkpoint with ``distributed_checkpoint_dir``.
``DistributedTrainableCreator`` turns it into a Tune trainable.

    python examples/func_trainable.py --smoke-test
    python examples/func_trainable.py --num-workers 2 --address auto

``train_simple`` and ``train_check_global`` are the small functions Ray 1.x's tests
ran (``ray.util.sgd.torch.func_trainable._train_simple``).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from raysgd.function.session import distributed_checkpoint_dir, is_distributed_trainable
from raysgd.torch.examples._cluster import add_cluster_flags, init_ray
from raysgd.torch.examples.digits import DigitsNet, digits_datasets

CHECKPOINT_FILE = "checkpoint"


def _report(**metrics: Any) -> None:
    from ray import tune

    tune.report(metrics)


def train_simple(config: Dict[str, Any], checkpoint_dir: Optional[str] = None) -> None:
    """A 5-5-5 MLP on one random batch for ``config["epochs"]`` (10) epochs; reports
    ``mean_loss`` each epoch and checkpoints (model, optimizer) every third epoch unless
    ``config["enable_checkpoint"]`` is False."""
    torch.manual_seed(dist.get_rank())
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    model = nn.Sequential(nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    if checkpoint_dir:
        model_state, optimizer_state = torch.load(os.path.join(checkpoint_dir, CHECKPOINT_FILE))
        model.load_state_dict(model_state)
        optimizer.load_state_dict(optimizer_state)
    model = DistributedDataParallel(model)
    for epoch in range(config.get("epochs", 10)):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        if epoch % 3 == 0 and config.get("enable_checkpoint", True):
            with distributed_checkpoint_dir(step=epoch) as path:
                torch.save((model.module.state_dict(), optimizer.state_dict()),
                           os.path.join(path, CHECKPOINT_FILE))
        _report(mean_loss=loss.item())


def train_check_global(config: Dict[str, Any], checkpoint_dir: Optional[str] = None) -> None:
    """Reports ``is_distributed=True`` once; fails outside a function trainable."""
    assert is_distributed_trainable()
    _report(is_distributed=True)


def train_validate_session(config: Dict[str, Any], checkpoint_dir: Optional[str] = None) -> None:
    """Fails unless Tune's context on this worker names the trial that runs it (Ray 1.12's
    ``_train_validate_session`` check; 1.12 read ``tune.session``, today's API is
    ``ray.tune.get_context``)."""
    from ray import tune

    context = tune.get_context()
    names = (context.get_trial_id(), context.get_trial_name())
    if any(name in (None, "", "default") for name in names):
        raise AssertionError(f"the worker's Tune session does not name its trial: {names}")
    _report(seen_trial_id=names[0])


def train_digits(config: Dict[str, Any], checkpoint_dir: Optional[str] = None) -> None:
    """The digits CNN, data-parallel; resumes from ``checkpoint_dir`` when Tune restores."""
    torch.manual_seed(0)  # the same initial weights on every rank
    train_set, val_set = digits_datasets()
    sampler = DistributedSampler(train_set, shuffle=True)
    loader = DataLoader(train_set, batch_size=config.get("batch_size", 32), sampler=sampler)
    model = DigitsNet(width=config.get("width", 16))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    start = 0
    if checkpoint_dir:
        state = torch.load(os.path.join(checkpoint_dir, CHECKPOINT_FILE))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"] + 1
    ddp = DistributedDataParallel(model)
    for epoch in range(start, config.get("epochs", 5)):
        sampler.set_epoch(epoch)
        ddp.train()
        for images, labels in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp(images), labels).backward()
            optimizer.step()
        with distributed_checkpoint_dir(step=epoch) as path:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch}, os.path.join(path, CHECKPOINT_FILE))
        _report(epoch=epoch, val_accuracy=_accuracy(model, val_set))


def _accuracy(model: nn.Module, dataset) -> float:
    model.eval()
    images, labels = dataset.tensors
    with torch.no_grad():
        return (model(images).argmax(dim=1) == labels).float().mean().item()


def main(argv=None) -> Dict[str, Any]:
    """``python examples/func_trainable.py [--smoke-test] [--num-workers N] [--address auto]``"""
    from ray import tune

    from raysgd.function.trainable import DistributedTrainableCreator

    parser = argparse.ArgumentParser(description="A DDP training function under Ray Tune.")
    parser.add_argument("--smoke-test", action="store_true", help="2 trials of 2 epochs")
    add_cluster_flags(parser, num_workers=2)
    args = parser.parse_args(argv)
    init_ray(args, num_cpus=4)
    trainable = DistributedTrainableCreator(train_digits, num_workers=args.num_workers,
                                            use_gpu=args.use_gpu)
    epochs = 2 if args.smoke_test else 8
    with tempfile.TemporaryDirectory() as storage:
        tuner = tune.Tuner(
            trainable,
            param_space={"lr": tune.grid_search([0.01, 0.1]), "epochs": epochs},
            tune_config=tune.TuneConfig(metric="val_accuracy", mode="max"),
            run_config=tune.RunConfig(storage_path=storage, verbose=1))
        best = tuner.fit().get_best_result()
    print(f"best lr {best.config['lr']}: validation accuracy {best.metrics['val_accuracy']:.3f} "
          f"after {best.metrics['training_iteration']} epochs")
    return {"config": best.config, "val_accuracy": best.metrics["val_accuracy"]}


if __name__ == "__main__":
    main()
