"""Ray Data input: Parquet files → ``map_batches`` preprocessing → raysgd on 2 workers.

Shows ``TorchTrainer(datasets=..., dataset_config=DatasetConfig(...))``: the
trainer streams a ``ray.data.Dataset`` to its workers (split across them, a
share each per epoch) instead of a ``DataLoader`` registered in the operator.

The script writes a synthetic classification data set (Gaussian blobs, no
download) as Parquet files into a temporary directory, reads it back with
``ray.data.read_parquet``, splits off a validation set (``train_test_split``),
standardizes the features on the cluster with ``map_batches`` (mean and
standard deviation of the training split, computed by Ray Data) into one
float32 ``features`` column, and trains a small MLP. Each epoch prints the
training loss and the validation loss and accuracy; the last line reads
``final validation accuracy: 0.9...``.

    python examples/ray_data_example.py --smoke-test      # small and quick
    python examples/ray_data_example.py --num-rows 100000 --epochs 10
    python examples/ray_data_example.py --address auto    # on a running cluster
"""
from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import ray
from ray.data.aggregate import Mean, Std
from raysgd import DatasetConfig, TorchTrainer
from raysgd.torch import TrainingOperator
from raysgd.utils import BATCH_SIZE

NUM_FEATURES = 16
NUM_CLASSES = 4
FEATURE_NAMES = [f"f{i}" for i in range(NUM_FEATURES)]


def write_parquet(directory: str, num_rows: int, num_files: int, seed: int = 0) -> None:
    """``num_rows`` rows of ``f0..f15`` (float64, on different scales) and ``label`` (int64),
    as ``num_files`` Parquet files: Gaussian blobs, one per class, overlapping a little."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 1.0, size=(NUM_CLASSES, NUM_FEATURES))
    scales = rng.uniform(0.5, 20.0, size=NUM_FEATURES)  # standardizing matters
    offsets = rng.uniform(-50.0, 50.0, size=NUM_FEATURES)
    labels = rng.integers(0, NUM_CLASSES, size=num_rows)
    points = centers[labels] + rng.normal(0.0, 1.3, size=(num_rows, NUM_FEATURES))
    points = points * scales + offsets
    bounds = np.linspace(0, num_rows, num_files + 1).astype(int)
    for index, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        columns = {name: points[lo:hi, i] for i, name in enumerate(FEATURE_NAMES)}
        table = pa.table({**columns, "label": labels[lo:hi]})
        pq.write_table(table, os.path.join(directory, f"part-{index:03d}.parquet"))


def standardize(batch: dict, mean: dict, std: dict) -> dict:
    """``map_batches`` function: one float32 ``features`` column, standardized, and ``label``."""
    features = np.stack([(batch[name] - mean[name]) / std[name] for name in FEATURE_NAMES],
                        axis=1).astype(np.float32)
    return {"features": features, "label": batch["label"].astype(np.int64)}


def prepare(directory: str) -> tuple:
    """``(train, validation)`` Ray datasets, read from Parquet and preprocessed on the cluster."""
    dataset = ray.data.read_parquet(directory)
    # The rows were written in random order: the last 20 % make an unbiased validation set.
    train, validation = dataset.train_test_split(test_size=0.2)
    print(f"{dataset.count()} rows read from {directory}: {train.count()} for training, "
          f"{validation.count()} for validation")
    # The training split's mean and standard deviation of every feature, in one pass.
    stats = train.aggregate(*(agg(name) for name in FEATURE_NAMES for agg in (Mean, Std)))
    mean = {name: stats[f"mean({name})"] for name in FEATURE_NAMES}
    std = {name: stats[f"std({name})"] or 1.0 for name in FEATURE_NAMES}
    kwargs = {"fn_kwargs": {"mean": mean, "std": std}, "batch_format": "numpy"}
    # Lazy: every epoch's stream runs these map_batches tasks on the cluster while the
    # workers train on the batches already made.
    return train.map_batches(standardize, **kwargs), validation.map_batches(standardize, **kwargs)


class ClassifierOperator(TrainingOperator):
    """Registers the model, optimizer and loss; the batches come from the trainer's datasets."""

    def setup(self, config):
        torch.manual_seed(config.get("seed", 0))
        model = nn.Sequential(nn.Linear(NUM_FEATURES, config["hidden"]), nn.ReLU(),
                              nn.Linear(config["hidden"], NUM_CLASSES))
        optimizer = torch.optim.Adam(model.parameters(), lr=config["lr"])
        self.model, self.optimizer, self.criterion = self.register(
            models=model, optimizers=optimizer, criterion=nn.CrossEntropyLoss())


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-test", action="store_true",
                        help="small data set, 3 epochs (about half a minute)")
    parser.add_argument("--num-rows", type=int, default=20000)
    parser.add_argument("--num-files", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch size")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    args = parser.parse_args(argv)
    if args.smoke_test:
        args.num_rows, args.epochs = 4000, 3

    # "local": a Ray of its own, even where `ray start` left a cluster running.
    ray.init(address=args.address or "local",
             num_cpus=None if args.address else args.num_workers + 2, include_dashboard=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory(prefix="raysgd-ray-data-") as directory:
        write_parquet(directory, args.num_rows, args.num_files)
        train, validation = prepare(directory)
        trainer = TorchTrainer(
            training_operator_cls=ClassifierOperator, num_workers=args.num_workers,
            use_gpu=False, config={BATCH_SIZE: args.batch_size, "lr": 1e-2, "hidden": 64},
            datasets={"train": train, "validation": validation},
            dataset_config=DatasetConfig(feature_columns=["features"], label_column="label"))
        print(f"{'epoch':>5} {'train_loss':>10} {'val_loss':>10} {'val_accuracy':>12} "
              f"{'train rows':>10}")
        val = {}
        for _ in range(args.epochs):
            metrics, val = trainer.train(), trainer.validate()
            print(f"{metrics['epoch']:>5} {metrics['train_loss']:>10.4f} {val['val_loss']:>10.4f} "
                  f"{val['val_accuracy']:>12.4f} {metrics['num_samples']:>10}", flush=True)
        trainer.shutdown()
    ray.shutdown()
    accuracy = val["val_accuracy"]
    print(f"final validation accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main()
