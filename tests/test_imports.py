"""Legacy import paths resolve, and the module layering stays true."""
import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "raysgd"

LEGACY_NAMES = {
    "raysgd": ["TorchTrainer"],
    "raysgd.torch": ["TorchTrainer", "TrainingOperator", "BaseTorchTrainable", "CreatorOperator"],
    "raysgd.utils": ["BATCH_SIZE", "NUM_SAMPLES", "BATCH_COUNT", "AverageMeter",
                     "AverageMeterCollection", "override"],
    "raysgd.torch.examples.train_example": ["LinearDataset", "model_creator", "optimizer_creator",
                                            "scheduler_creator", "data_creator"],
    "raysgd.torch.resnet": ["ResNet18", "ResNet34", "ResNet50"],
}


@pytest.mark.parametrize("module", sorted(LEGACY_NAMES))
def test_legacy_paths_resolve(module):
    imported = importlib.import_module(module)
    for name in LEGACY_NAMES[module]:
        assert hasattr(imported, name), f"{module}.{name} is missing"


def test_legacy_constants_and_resnets():
    import torch

    from raysgd.torch.resnet import ResNet18
    from raysgd.utils import BATCH_COUNT, BATCH_SIZE, NUM_SAMPLES

    assert (BATCH_SIZE, NUM_SAMPLES, BATCH_COUNT) == ("*batch_size", "num_samples", "batch_count")
    model = ResNet18({"ignored": True})
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_base_torch_trainable_is_a_tune_trainable_from_the_legacy_path():
    from ray import tune

    from raysgd.torch import BaseTorchTrainable, TorchTrainer

    assert issubclass(BaseTorchTrainable, tune.Trainable)
    trainable = TorchTrainer.as_trainable(training_operator_cls=object, num_workers=3)
    assert issubclass(trainable, BaseTorchTrainable)


def test_override_decorator():
    from raysgd.torch import TrainingOperator
    from raysgd.utils import override

    class Op(TrainingOperator):
        @override(TrainingOperator)
        def train_batch(self, batch, batch_info):
            return {}

    with pytest.raises(NameError):
        override(TrainingOperator)(lambda self: None)


def _imports(path):
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _modules():
    return {str(p.relative_to(PACKAGE.parent)): p for p in PACKAGE.rglob("*.py")}


RAY_BOUNDARY = ("raysgd/driver/worker_group.py", "raysgd/driver/fanout.py", "raysgd/driver/warm.py",
                "raysgd/driver/placement.py", "raysgd/driver/watch.py", "raysgd/worker/actor.py",
                "raysgd/data/feed.py", "raysgd/tune.py", "raysgd/function/trainable.py",
                "raysgd/function/hooks.py")


def test_only_the_worker_group_imports_ray():
    """The worker group (with its fan-out, warm-process, placement, watch and data-split helpers), Tune and the function
    trainable's Tune side and session hooks are the Ray boundary."""
    offenders = [name for name, path in _modules().items()
                 if any(n == "ray" or n.startswith("ray.") for n in _imports(path))
                 and name not in RAY_BOUNDARY
                 and "/examples/" not in name]
    assert offenders == []


def _dotted_names(path):
    def dotted(node):
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    return {dotted(n) for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}


def test_only_precision_touches_autocast_and_grad_scaler():
    amp = {"torch.autocast", "torch.amp.autocast", "torch.amp.GradScaler",
           "torch.cuda.amp.autocast", "torch.cuda.amp.GradScaler"}
    offenders = [name for name, path in _modules().items()
                 if _dotted_names(path) & amp and name != "raysgd/worker/precision.py"]
    assert offenders == []
    assert _dotted_names(PACKAGE / "worker" / "precision.py") & amp  # the check can see them


def test_the_library_never_prints():
    """Lifecycle news goes to the "raysgd" logger; only the example scripts and the
    command-line tools (``python -m raysgd.plot``) print."""
    tools = ("raysgd/plot.py",)
    offenders = [name for name, path in _modules().items()
                 if "/examples/" not in name and name not in tools
                 and any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "print"
                         for n in ast.walk(ast.parse(path.read_text())))]
    assert offenders == []


def test_modules_stay_small():
    big = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {n: c for n, c in big.items() if c > 400} == {}


def test_import_raysgd_does_not_import_tune():
    code = "import sys, raysgd, raysgd.torch; print('ray.tune' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
