"""The README's main job and a legacy script with only its imports swapped."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def run(args, **kwargs):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=220, **kwargs)


def test_digits_demo_reaches_090_and_reloads_the_same_accuracy():
    out = run(["examples/digits_demo.py", "--epochs", "5"])
    assert out.returncode == 0, out.stderr[-3000:]
    match = re.search(r"before save: ([\d.]+), after reload into a fresh trainer: ([\d.]+)", out.stdout)
    assert match, out.stdout
    before, after = float(match.group(1)), float(match.group(2))
    assert before > 0.9 and after == before


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


def test_legacy_operator_script_runs_with_swapped_imports(tmp_path):
    script = tmp_path / "legacy.py"
    script.write_text(LEGACY_SCRIPT)
    out = run([str(script)])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "EPOCH 3 SAMPLES 1000 VAL 1000" in out.stdout


def test_tune_example_smoke_picks_the_best_lr():
    out = run(["examples/tune_example.py", "--smoke-test"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "best config: {'lr': 0.01}" in out.stdout


def test_pbt_example_smoke_finishes():
    out = run(["examples/pbt_example.py", "--smoke-test"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"best trial: lr=[\d.e+-]+, val_loss=[\d.]+", out.stdout), out.stdout[-2000:]
