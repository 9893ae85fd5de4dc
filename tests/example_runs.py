"""The example scripts' smoke runs that ``test_examples.py`` checks.

They go into the session's background batch (``conftest.background``, a
:class:`background.Batch`) beside the benchmarks' quick runs (``bench_runs``); each
test of a script waits for its own run, ``background.result(name, WAIT_S)``. Each run
is ``python <script> ...`` from the repository root.
"""
import functools
import os
import subprocess
import sys
import textwrap
from typing import Callable, Dict

from background import Batch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_MODULE = "test_examples"
# One run's limit: alone, the longest takes about a minute; started beside the
# in-process tests at a lower priority, it may take several times that.
RUN_TIMEOUT_S = 600

LEGACY_SCRIPT = textwrap.dedent('''
    # The seed's operator example, with `ray.util.sgd` replaced by `raysgd`.
    import torch
    import torch.nn as nn
    from torch.utils.data import DataLoader

    import ray
    from raysgd import TorchTrainer
    from raysgd.torch import TrainingOperator
    from raysgd.torch.examples.train_example import LinearDataset
    from raysgd.utils import BATCH_SIZE

    class MyTrainingOperator(TrainingOperator):
        def setup(self, config):
            train_dataset, val_dataset = LinearDataset(2, 5), LinearDataset(2, 5)
            train_loader = DataLoader(train_dataset, batch_size=config[BATCH_SIZE])
            val_loader = DataLoader(val_dataset, batch_size=config[BATCH_SIZE])
            model = nn.Linear(1, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 1e-4))
            criterion = torch.nn.MSELoss()
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.9)
            self.model, self.optimizer, self.criterion, self.scheduler = \\
                self.register(models=model, optimizers=optimizer, criterion=criterion,
                              schedulers=scheduler)
            self.register_data(train_loader=train_loader, validation_loader=val_loader)

    ray.init(num_cpus=2)
    trainer = TorchTrainer(training_operator_cls=MyTrainingOperator, scheduler_step_freq="epoch",
                           num_workers=2, use_gpu=False, config={"lr": 0.001, BATCH_SIZE: 64})
    for i in range(3):
        metrics = trainer.train()
        val_metrics = trainer.validate()
    print("EPOCH", metrics["epoch"], "SAMPLES", metrics["num_samples"], "VAL", val_metrics["num_samples"])
    trainer.shutdown()
''')


def run(batch: Batch, args) -> subprocess.CompletedProcess:
    """One script run, as ``subprocess.run([python, *args])`` from the repository root."""
    return batch.run([sys.executable, *args], timeout=RUN_TIMEOUT_S, cwd=REPO_ROOT)


def digits_demo_twice(batch: Batch, run_dir) -> tuple:
    """The README's main job (5 epochs), then again on its run directory with 6:
    ``(run_dir, first run, second run or None)``."""
    first = run(batch, ["examples/digits_demo.py", "--epochs", "5", "--run-dir", str(run_dir)])
    if first.returncode != 0:
        return run_dir, first, None
    return run_dir, first, run(batch, ["examples/digits_demo.py", "--epochs", "6",
                                       "--run-dir", str(run_dir)])


def legacy_script(batch: Batch, directory) -> subprocess.CompletedProcess:
    script = directory / "legacy.py"
    script.write_text(LEGACY_SCRIPT)
    return run(batch, [str(script)])


def _with_path(batch: Batch, args, path):
    return run(batch, args), path


def _smoke(script: str) -> Callable[[Batch], subprocess.CompletedProcess]:
    return functools.partial(run, args=[f"examples/{script}", "--smoke-test"])


def example_jobs(tmp_path_factory) -> Dict[str, Callable[[Batch], object]]:
    """Every example script run, by name, longest first; directories from
    ``tmp_path_factory``."""
    digits = tmp_path_factory.mktemp("digits")
    legacy = tmp_path_factory.mktemp("legacy")
    bench = tmp_path_factory.mktemp("benchmark")
    fsdp_run = tmp_path_factory.mktemp("fsdp") / "run"
    return {
        "pbt": _smoke("pbt_example.py"),
        "func_trainable": _smoke("func_trainable.py"),
        "ray_data": _smoke("ray_data_example.py"),
        "digits": functools.partial(digits_demo_twice, run_dir=digits / "run"),
        "tune": _smoke("tune_example.py"),
        "dcgan": _smoke("dcgan.py"),
        "cifar": _smoke("cifar_pytorch_example.py"),
        "legacy": functools.partial(legacy_script, directory=legacy),
        "fsdp": functools.partial(_with_path, args=["examples/fsdp_example.py", "--smoke-test",
                                                    "--checkpoint-dir", str(fsdp_run)],
                                  path=fsdp_run),
        "train": _smoke("train_example.py"),
        "benchmark": functools.partial(_with_path, args=["examples/benchmark.py", "--smoke-test",
                                                         "--out", str(bench / "b.json")],
                                       path=bench / "b.json"),
    }
