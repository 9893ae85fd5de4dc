"""Grid search over the learning rate with Ray Tune (``ray.util.sgd.torch.examples.tune_example``).

Each trial runs a ``TorchTrainer`` on the linear data set (``y = 2x + 5``);
``step()`` is one ``train()`` plus one ``validate()`` with metrics averaged over
the workers, or, in :func:`tune_example_manual`, a step of your own that also
feeds the validation loss to a ``ReduceLROnPlateau`` scheduler.

    python examples/tune_example.py --smoke-test
    python examples/tune_example.py --num-workers 2 --address auto
    python examples/tune_example.py --lr-reduce-on-plateau --server-address HOST:10001
"""
from __future__ import annotations

import argparse
import tempfile
from typing import Any, Dict, Optional, Sequence

import torch
from torch import nn
from torch.optim.lr_scheduler import ReduceLROnPlateau

from raysgd import TorchTrainer
from raysgd.torch import TrainingOperator
from raysgd.torch.examples._cluster import add_cluster_flags, client_connected, init_ray
from raysgd.torch.examples.train_example import data_creator, model_creator
from raysgd.utils import BATCH_SIZE

LEGACY_GRID = (1e-4, 1e-3)


def optimizer_creator(model, config):
    return torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-4))


def scheduler_creator(optimizer, config):
    return ReduceLROnPlateau(optimizer, mode="min")


def get_custom_training_operator(lr_reduce_on_plateau: bool = False) -> type:
    """The linear operator: ``nn.Linear(1, 1)``, MSE, SGD (``config["lr"]``, default 1e-4),
    1,000 training and 400 validation points of ``y = 2x + 5`` in batches of
    ``config[BATCH_SIZE]``. With ``lr_reduce_on_plateau`` it also registers a
    ``ReduceLROnPlateau`` scheduler (train it with :func:`tune_example_manual`)."""
    return TrainingOperator.from_creators(
        model_creator=model_creator, optimizer_creator=optimizer_creator,
        data_creator=data_creator, loss_creator=nn.MSELoss,
        scheduler_creator=scheduler_creator if lr_reduce_on_plateau else None)


def _run(trainable, num_samples: int, iterations: int, lrs: Sequence[float],
         storage_path: Optional[str], verbose: int) -> Dict[str, Any]:
    from ray import tune

    analysis = tune.run(trainable, num_samples=num_samples,
                        config={"lr": tune.grid_search(list(lrs))},
                        stop={"training_iteration": iterations}, verbose=verbose,
                        storage_path=storage_path)
    return analysis.get_best_config(metric="val_loss", mode="min")


def tune_example(operator_cls, num_workers: int = 1, use_gpu: bool = False, *,
                 num_samples: int = 3, iterations: int = 2, lrs: Sequence[float] = LEGACY_GRID,
                 storage_path: Optional[str] = None, verbose: int = 1) -> Dict[str, Any]:
    """``tune.run`` over ``lr`` in ``lrs``, ``num_samples`` times each, ``iterations`` steps
    per trial; returns the config with the lowest final ``val_loss``."""
    trainable = TorchTrainer.as_trainable(training_operator_cls=operator_cls,
                                          num_workers=num_workers, use_gpu=use_gpu,
                                          config={BATCH_SIZE: 128})
    return _run(trainable, num_samples, iterations, lrs, storage_path, verbose)


def manual_step(trainer, info: dict) -> Dict[str, Any]:
    """One Tune step that also steps the scheduler on the validation loss."""
    train_stats = trainer.train(profile=True)
    val_stats = trainer.validate(profile=True)
    trainer.update_scheduler(metric=val_stats["val_loss"])
    # Validation keys that clash with training keys get a ``val_`` prefix, as in the default step.
    merged = dict(train_stats)
    for key, value in val_stats.items():
        if key == "profile":
            merged["profile"] = {**train_stats.get("profile", {}), **value}
        else:
            merged[key if key not in train_stats else f"val_{key}"] = value
    return merged


def tune_example_manual(operator_cls, num_workers: int = 1, use_gpu: bool = False, *,
                        num_samples: int = 3, iterations: int = 2,
                        lrs: Sequence[float] = LEGACY_GRID, storage_path: Optional[str] = None,
                        verbose: int = 1) -> Dict[str, Any]:
    """As :func:`tune_example`, with ``scheduler_step_freq="manual"`` and :func:`manual_step`
    as the Tune step (profiled ``train`` and ``validate``, then ``update_scheduler``)."""
    trainable = TorchTrainer.as_trainable(override_tune_step=manual_step,
                                          training_operator_cls=operator_cls,
                                          num_workers=num_workers, use_gpu=use_gpu,
                                          scheduler_step_freq="manual", config={BATCH_SIZE: 128})
    return _run(trainable, num_samples, iterations, lrs, storage_path, verbose)


def main(argv=None) -> Dict[str, Any]:
    """``python examples/tune_example.py [--smoke-test] [--lr-reduce-on-plateau]
    [--num-workers N] [--use-gpu] [--address auto | --server-address HOST:PORT]``"""
    parser = argparse.ArgumentParser(
        description="Grid search over the learning rate with Ray Tune.")
    parser.add_argument("--smoke-test", action="store_true",
                        help="lr 1e-4 and 1e-2, 1 worker, 2 iterations")
    add_cluster_flags(parser, num_workers=2)
    parser.add_argument("--lr-reduce-on-plateau", action="store_true",
                        help="a ReduceLROnPlateau scheduler stepped by a custom Tune step")
    args = parser.parse_args(argv)
    init_ray(args, num_cpus=4)
    # The smoke test's two trials run side by side on 4 CPUs (a trial takes 2: itself, a worker).
    workers, iterations, lrs = ((1, 2, (1e-4, 1e-2)) if args.smoke_test
                                else (args.num_workers, 3, (1e-4, 1e-3, 1e-2)))
    run = tune_example_manual if args.lr_reduce_on_plateau else tune_example
    operator = get_custom_training_operator(args.lr_reduce_on_plateau)
    settings = dict(num_samples=1, iterations=iterations, lrs=lrs)
    if client_connected():  # results stay on the cluster (a driver's temp dir is not there)
        best = run(operator, workers, args.use_gpu, **settings)
    else:
        with tempfile.TemporaryDirectory() as storage:
            best = run(operator, workers, args.use_gpu, storage_path=storage, **settings)
    print(f"best config: {best}")
    return best


if __name__ == "__main__":
    main()
