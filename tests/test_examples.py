"""Every example script in smoke mode, the README's main job, and a legacy script with
only its imports swapped."""
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


def test_train_example_smoke_fits_the_line():
    out = run(["examples/train_example.py", "--smoke-test"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'epoch': 2" in out.stdout and "val_loss" in out.stdout
    weight = float(re.search(r"trained weight: ([-\d.e]+)", out.stdout).group(1))
    assert 1.0 < weight < 3.0  # y = 2x + 5, two epochs in


def test_cifar_example_smoke_says_its_data_is_synthetic():
    out = run(["examples/cifar_pytorch_example.py", "--smoke-test"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "data: SYNTHETIC CIFAR-shaped images" in out.stdout
    assert re.search(r"\[synthetic\] epoch 1: train_loss [\d.]+, val_loss [\d.]+, "
                     r"val_accuracy [\d.]+, val_top5_accuracy [\d.]+", out.stdout), out.stdout


def test_dcgan_smoke_reports_the_quality_proxy():
    out = run(["examples/dcgan.py", "--smoke-test"])
    assert out.returncode == 0, out.stderr[-3000:]
    real = re.search(r"real validation digits: confidence ([\d.]+), digit score ([\d.]+)", out.stdout)
    assert real and float(real.group(1)) > 0.8, out.stdout  # the judge recognises real digits
    assert re.search(r"epoch 1: loss_d [\d.]+, loss_g [\d.]+, d_real [\d.]+, d_fake [\d.]+; "
                     r"generated: confidence [\d.]+, digit score [\d.]+", out.stdout), out.stdout


def test_benchmark_example_smoke_prints_the_ratio(tmp_path):
    out = run(["examples/benchmark.py", "--smoke-test", "--out", str(tmp_path / "b.json")])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "raysgd(1 worker)/plain" in out.stdout and (tmp_path / "b.json").exists()
