"""Ray Data input benchmark (issue 15): raysgd fed from a ``ray.data.Dataset``.

``python -m bench.data [--quick] [--repeats N] [--variants ...] [--out PATH]``
(or ``python -m bench --data``) runs, each as its own subprocess with
repetitions in rotating order, the bench MLP (``bench/workloads.py``) on 2
workers with one torch thread each:

* ``raysgd_raydata``: raysgd ``TorchTrainer(datasets={"train": ds},
  dataset_config=DatasetConfig(feature_columns=["x"], label_column="y"))``
  over an in-memory dataset built on the driver from the workload's arrays;
* ``raysgd_loader``: raysgd fed from the ``DataLoader`` the main benchmark
  registers (``bench/raysgd_operator.py``), the same arrays;
* ``raytrain_raydata``: Ray Train's ``TorchTrainer(datasets={"train": ds})``,
  the loop iterating ``get_dataset_shard("train").iter_torch_batches``.

See ``bench/README.md`` ("Ray Data input") for the figures and the target.
"""

# raysgd over Ray Data against Ray Train over Ray Data, steady samples/s (printed, never enforced).
RAYTRAIN_THROUGHPUT_TARGET = 1.0

# Blocks the in-memory dataset is cut into (both modes): several, so the split has
# blocks to hand out rather than one block to slice.
NUM_BLOCKS = 8
