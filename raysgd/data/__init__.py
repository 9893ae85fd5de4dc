"""Data input: Ray Data datasets split across the workers, and the legacy ``Dataset``.

``dataset_config`` checks the inputs (pure), ``feed`` splits the datasets on the
driver, ``shards`` reads one rank's shard as a loader on the worker.

The package itself is the legacy ``ray.util.sgd.data``: ``Dataset`` for
``trainer.train(dataset=...)``.

Ray 1.12 streamed it through ``ray.util.iter``, which Ray removed in 2.0; here it
is built on Ray Data and split across the workers like ``TorchTrainer(datasets=...)``
(see docs/guides/ray-data.md).
"""
from raysgd.data.dataset import Dataset

__all__ = ["Dataset"]
