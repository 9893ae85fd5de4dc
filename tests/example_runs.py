"""The example scripts that ``test_examples.py`` checks, as jobs of the session's batch.

Each job is the same command the test ran itself before (``python SCRIPT ...``
from the repository root) and returns what the test checks: the finished
process, and the files it wrote where the test reads them. The session's
:class:`background.Batch` (``conftest.background``) runs them after the
benchmarks' quick runs, the longest first; ``test_examples.py`` asks for them by
name through its ``scripts`` fixture.
"""
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable, Dict

from background import Batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_MODULE = "test_examples"
# One run's limit: alone, the longest takes about a minute.
RUN_TIMEOUT_S = 400


def run(batch: Batch, args) -> subprocess.CompletedProcess:
    """One script run, as ``subprocess.run([python, *args])`` from the repository root."""
    return batch.run([sys.executable, *args], timeout=RUN_TIMEOUT_S, cwd=ROOT)


def digits_demo_twice(batch: Batch, run_dir) -> tuple:
    """The README's main job (5 epochs), then again on its run directory with 6:
    ``(run_dir, first run, second run or None)``."""
    first = run(batch, ["examples/digits_demo.py", "--epochs", "5", "--run-dir", str(run_dir)])
    if first.returncode != 0:
        return run_dir, first, None
    return run_dir, first, run(batch, ["examples/digits_demo.py", "--epochs", "6",
                                       "--run-dir", str(run_dir)])


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


def legacy_script(batch: Batch, directory) -> subprocess.CompletedProcess:
    script = directory / "legacy.py"
    script.write_text(LEGACY_SCRIPT)
    return run(batch, [str(script)])


def example_jobs(tmp_path_factory) -> Dict[str, Callable[[Batch], Any]]:
    """Every example run that ``test_examples.py`` checks, by name, the longest first; their
    files in new directories of ``tmp_path_factory``."""
    digits = tmp_path_factory.mktemp("digits")
    legacy = tmp_path_factory.mktemp("legacy")
    bench = tmp_path_factory.mktemp("benchmark")
    fsdp_run = tmp_path_factory.mktemp("fsdp") / "run"
    return {
        "pbt": lambda b: run(b, ["examples/pbt_example.py", "--smoke-test"]),
        "digits": lambda b: digits_demo_twice(b, digits / "run"),
        "ray_data": lambda b: run(b, ["examples/ray_data_example.py", "--smoke-test"]),
        "func_trainable": lambda b: run(b, ["examples/func_trainable.py", "--smoke-test"]),
        "dcgan": lambda b: run(b, ["examples/dcgan.py", "--smoke-test"]),
        "tune": lambda b: run(b, ["examples/tune_example.py", "--smoke-test"]),
        "cifar": lambda b: run(b, ["examples/cifar_pytorch_example.py", "--smoke-test"]),
        "legacy": lambda b: legacy_script(b, legacy),
        "train": lambda b: run(b, ["examples/train_example.py", "--smoke-test"]),
        "fsdp": lambda b: (run(b, ["examples/fsdp_example.py", "--smoke-test", "--checkpoint-dir",
                                   str(fsdp_run)]), fsdp_run),
        "benchmark": lambda b: (run(b, ["examples/benchmark.py", "--smoke-test", "--out",
                                        str(bench / "b.json")]), bench / "b.json"),
    }
