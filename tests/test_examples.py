"""Every example script in smoke mode, the README's main job, a legacy script with only its
imports swapped, and the legacy example functions called by their legacy names from
``raysgd.torch.examples.*`` on one shared in-process Ray."""
import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from background import Batch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
# A test of a script waits for its run, which may be queued behind others (see `scripts`).
WAIT_S = 900
waits_for_its_script = pytest.mark.timeout(WAIT_S + 60)


def run(batch: Batch, args) -> subprocess.CompletedProcess:
    """One script run, as ``subprocess.run([python, *args])`` from the repository root."""
    return batch.run([sys.executable, *args], timeout=220, cwd=ROOT)


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


_batches = []  # this module's batch of script runs, once started


@pytest.fixture(scope="module")
def scripts(tmp_path_factory):
    """Every example script run that the tests above the in-process ones check, by name,
    two at a time (``background``) from the first test's start, longest first; each
    test waits for its own (``scripts.result(name, WAIT_S)``) and checks its output."""
    digits = tmp_path_factory.mktemp("digits")
    legacy = tmp_path_factory.mktemp("legacy")
    bench = tmp_path_factory.mktemp("benchmark")
    fsdp_run = tmp_path_factory.mktemp("fsdp") / "run"
    batch = Batch({
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
    })
    _batches.append(batch)
    yield batch
    batch.close()


@pytest.fixture(autouse=True)
def _scripts_ended(request):
    """The in-process tests below do not run beside the scripts."""
    if "scripts" not in request.fixturenames:
        for batch in _batches:
            batch.wait_all()


@waits_for_its_script
def test_digits_demo_reaches_090_reloads_the_same_accuracy_and_resumes(scripts):
    run_dir, out, again = scripts.result("digits", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    match = re.search(r"before save: ([\d.]+), after reload into a fresh trainer: ([\d.]+)", out.stdout)
    assert match, out.stdout
    before, after = float(match.group(1)), float(match.group(2))
    assert before > 0.9 and after == before
    curves = re.search(r"curves: (\S+)", out.stdout).group(1)
    assert curves == str(run_dir / "curves.png") and open(curves, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert f"checkpoint directory: {run_dir}" in out.stdout and (run_dir / "best.pt").exists()
    # Run again: it resumes after epoch 5 and trains only the sixth.
    assert again.returncode == 0, again.stderr[-3000:]
    assert "5 epoch(s) already trained" in again.stdout
    epochs = re.findall(r"^\s+(\d+) +[\d.]+ +[\d.]+ +[\d.]+$", again.stdout, re.M)
    assert epochs == ["6"], again.stdout
    rows = (run_dir / "metrics.csv").read_text().splitlines()[1:]
    assert [row.split(",")[1] for row in rows] == ["1", "1", "2", "2", "3", "3", "4", "4", "5",
                                                   "5", "6", "6"]


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


@waits_for_its_script
def test_legacy_operator_script_runs_with_swapped_imports(scripts):
    out = scripts.result("legacy", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "EPOCH 3 SAMPLES 1000 VAL 1000" in out.stdout


@waits_for_its_script
def test_tune_example_smoke_picks_the_best_lr(scripts):
    out = scripts.result("tune", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "best config: {'lr': 0.01}" in out.stdout


@waits_for_its_script
def test_pbt_example_smoke_finishes(scripts):
    out = scripts.result("pbt", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"best trial: lr=[\d.e+-]+, val_loss=[\d.]+", out.stdout), out.stdout[-2000:]


@waits_for_its_script
def test_func_trainable_smoke_picks_a_learning_rate(scripts):
    out = scripts.result("func_trainable", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    match = re.search(r"best lr ([\d.]+): validation accuracy ([\d.]+) after 2 epochs", out.stdout)
    assert match, out.stdout[-2000:]
    assert float(match.group(2)) > 0.5  # 2 epochs of a CNN on digits, well above chance (0.1)


@waits_for_its_script
def test_train_example_smoke_fits_the_line(scripts):
    out = scripts.result("train", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'epoch': 2" in out.stdout and "val_loss" in out.stdout
    weight = float(re.search(r"trained weight: ([-\d.e]+)", out.stdout).group(1))
    assert 1.0 < weight < 3.0  # y = 2x + 5, two epochs in


@waits_for_its_script
def test_fsdp_example_smoke_trains_sharded_and_its_checkpoint_loads_into_a_plain_module(scripts):
    out, run_dir = scripts.result("fsdp", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    latest = run_dir / json.loads((run_dir / "index.json").read_text())["latest"]
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(latest))
    losses = [float(v) for v in re.findall(r"val_loss ([\d.]+)", out.stdout)]
    assert len(losses) == 3 and losses[1] < losses[0], out.stdout
    assert losses[2] == pytest.approx(losses[1], abs=1e-4)  # the plain module, same weights
    assert "sharded over 2 workers" in out.stdout


@waits_for_its_script
def test_ray_data_example_smoke_streams_parquet_and_learns(scripts):
    out = scripts.result("ray_data", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = re.findall(r"^\s+\d+ +[\d.]+ +[\d.]+ +[\d.]+ +(\d+)$", out.stdout, re.M)
    assert rows and all(row == "3200" for row in rows), out.stdout[-2000:]  # every training row
    accuracy = float(re.search(r"final validation accuracy: ([\d.]+)", out.stdout).group(1))
    assert accuracy > 0.85


@waits_for_its_script
def test_cifar_example_smoke_names_its_data(scripts):
    from raysgd.torch.examples.cifar_pytorch_example import real_cifar_available

    out = scripts.result("cifar", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    data = "cifar10" if real_cifar_available("~/data") else "synthetic"
    assert ("data: CIFAR-10 from" if data == "cifar10" else
            "data: SYNTHETIC CIFAR-shaped images") in out.stdout
    assert re.search(rf"\[{data}\] epoch 1: train_loss [\d.]+, val_loss [\d.]+, "
                     r"val_accuracy [\d.]+, val_top5_accuracy [\d.]+", out.stdout), out.stdout


@waits_for_its_script
def test_dcgan_smoke_reports_the_quality_proxy(scripts):
    out = scripts.result("dcgan", WAIT_S)
    assert out.returncode == 0, out.stderr[-3000:]
    real = re.search(r"real validation digits: confidence ([\d.]+), digit score ([\d.]+)", out.stdout)
    assert real and float(real.group(1)) > 0.8, out.stdout  # the judge recognises real digits
    assert re.search(r"epoch 1: loss_d [\d.]+, loss_g [\d.]+, d_real [\d.]+, d_fake [\d.]+; "
                     r"generated: confidence [\d.]+, digit score [\d.]+", out.stdout), out.stdout


@waits_for_its_script
def test_benchmark_example_smoke_prints_the_ratio(scripts):
    out, saved = scripts.result("benchmark", WAIT_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "raysgd(1 worker)/plain" in out.stdout and saved.exists()


# ------------------------------------------------ legacy functions, by their legacy names
def test_legacy_train_example(ray_cpus, capsys):
    from raysgd.torch.examples.train_example import model_creator, train_example

    assert model_creator({}).out_features == 1
    assert model_creator({"hidden_size": 3}).out_features == 3
    model = train_example(1, False)  # legacy positional (num_workers, use_gpu)
    out = capsys.readouterr().out
    assert "'epoch': 5" in out and "val_loss" in out and "trained weight" in out
    assert 1.0 < model.weight.item() < 3.0  # y = 2x + 5


def _last_results(storage):
    rows = [json.loads(open(path).read().strip().splitlines()[-1])
            for path in glob.glob(os.path.join(storage, "**", "result.json"), recursive=True)]
    assert rows, f"no result.json under {storage}"
    return rows


def test_legacy_tune_example_picks_the_faster_lr(ray_cpus, tmp_path):
    from raysgd.torch.examples.tune_example import get_custom_training_operator, tune_example

    best = tune_example(get_custom_training_operator(), num_workers=1, use_gpu=False,
                        num_samples=1, storage_path=str(tmp_path), verbose=0)
    assert best == {"lr": 1e-3}  # from the legacy grid [1e-4, 1e-3]; 2 epochs favour the larger
    rows = _last_results(str(tmp_path))
    assert sorted(r["config"]["lr"] for r in rows) == [1e-4, 1e-3]
    assert all(r["training_iteration"] == 2 and "val_loss" in r for r in rows)


def test_legacy_tune_example_manual_steps_the_plateau_scheduler(ray_cpus, tmp_path):
    from raysgd.torch.examples.tune_example import (get_custom_training_operator,
                                                    tune_example_manual)

    operator = get_custom_training_operator(lr_reduce_on_plateau=True)
    best = tune_example_manual(operator, num_workers=1, num_samples=1,
                               storage_path=str(tmp_path), verbose=0)
    assert best["lr"] in (1e-4, 1e-3)
    for row in _last_results(str(tmp_path)):  # the custom step ran: profiled train + validate
        assert row["training_iteration"] == 2 and "val_loss" in row and "train_loss" in row
        assert {"train_epoch_s", "validation_s"} <= set(row["profile"])


@pytest.fixture
def as_ray_client(monkeypatch):
    """The examples' Ray Client path (set-up as Ray tasks, models fetched to the CPU) on the
    shared in-process Ray: only the question "is this driver a Ray Client?" is faked."""
    from raysgd.torch.examples import _cluster

    monkeypatch.setattr(_cluster, "client_connected", lambda: True)


def test_client_drivers_run_set_up_on_the_cluster(ray_cpus, as_ray_client):
    from raysgd.torch.examples._cluster import on_cluster

    def pid():
        return os.getpid()

    assert on_cluster(pid) != os.getpid()


def test_a_missing_optional_dependency_says_what_to_install(monkeypatch):
    from raysgd.torch.examples.digits import digits_datasets

    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        digits_datasets()


def test_legacy_dcgan_train_example_returns_the_running_trainer(ray_cpus, as_ray_client, capsys):
    from raysgd.torch.examples.dcgan import Discriminator, Generator, train_example

    # As a Ray Client driver: the judge is trained in a Ray task, the generator fetched to CPU.
    trainer = train_example(num_workers=1, use_gpu=False, test_mode=True, num_epochs=2)
    try:
        discriminator, generator = trainer.get_model()
    finally:
        trainer.shutdown()
    assert isinstance(discriminator, Discriminator) and isinstance(generator, Generator)
    import torch

    with torch.no_grad():
        images = generator.eval()(torch.randn(3, 100))
    assert images.shape == (3, 1, 32, 32) and images.abs().max() <= 1
    epochs = re.findall(r"epoch (\d+): loss_d [\d.]+, loss_g [\d.]+, .*digit score [\d.]+",
                        capsys.readouterr().out)
    assert epochs == ["1", "2"]


def test_legacy_train_cifar_returns_validation_metrics(ray_cpus, capsys):
    from raysgd.torch.examples.cifar_pytorch_example import real_cifar_available, train_cifar

    stats = train_cifar(test_mode=True, num_workers=1, use_gpu=False, num_epochs=1, fp16=False)
    data = "cifar10" if real_cifar_available("~/data") else "synthetic"
    assert stats["data"] == data and stats["num_samples"] == 32
    assert 0 <= stats["val_accuracy"] <= stats["val_top5_accuracy"] <= 1 and stats["val_loss"] > 0
    assert f"[{data}] epoch 1: train_loss" in capsys.readouterr().out
