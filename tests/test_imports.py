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


# Paths the README shows users (beside the legacy ones): they stay where they are whatever
# moves inside the package.
PUBLIC_NAMES = {
    "raysgd": ["TorchTrainer", "TrainingOperator", "DatasetConfig", "ConfigError",
               "idle_workers", "release_idle_workers"],
    "raysgd.recovery": ["FailureConfig"],
    "raysgd.loggers": ["Logger", "CSVLogger", "TensorBoardLogger", "MLflowLogger", "WandbLogger"],
    "raysgd.data": ["Dataset"],
}


@pytest.mark.parametrize("module,names", sorted(LEGACY_NAMES.items()) + sorted(PUBLIC_NAMES.items()))
def test_legacy_and_public_paths_resolve(module, names):
    imported = importlib.import_module(module)
    for name in names:
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
                "raysgd/driver/replicas.py", "raysgd/driver/staged.py", "raysgd/driver/stopping.py",
                "raysgd/driver/survivors.py", "raysgd/driver/slabs.py",
                "raysgd/data/feed.py", "raysgd/data/ray_collate.py", "raysgd/tune.py",
                "raysgd/function/trainable.py", "raysgd/function/hooks.py")


def test_only_the_worker_group_imports_ray():
    """The worker group (with its fan-out, warm-process, placement, watch, survivor hand-over, commit-slab and data-split helpers), Tune and the function
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


def test_import_raysgd_does_not_import_tune_or_ray_data():
    """Every operator module imports ``raysgd.torch`` (the legacy face, which brings the
    trainer), on every worker: Tune and Ray Data (pandas, pyarrow: about a CPU-second per
    process) load only when they are used."""
    code = ("import sys, raysgd, raysgd.torch, raysgd.trainer; "
            "print(sorted(m for m in ('ray.tune', 'ray.data', 'pandas') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# --- Layering: which code may import which (issue 23) -------------------------------------

def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted):
    base = PACKAGE.parent.joinpath(*dotted.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def _raysgd_imports(path):
    """{(imported raysgd module, lazy)}: ``from raysgd.worker import rng`` imports
    ``raysgd.worker.rng``; lazy means inside a function body."""
    found = set()

    def visit(node, lazy):
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.update((a.name, inner) for a in child.names if a.name.split(".")[0] == "raysgd")
            elif isinstance(child, ast.ImportFrom) and not child.level and child.module \
                    and child.module.split(".")[0] == "raysgd":
                names = [f"{child.module}.{a.name}" for a in child.names]
                found.update((m, inner) for m in names if _is_module(m))
                if not all(_is_module(m) for m in names):
                    found.add((child.module, inner))
            visit(child, inner)

    visit(ast.parse(path.read_text()), False)
    return found


def _graph():
    return {_module_name(p): _raysgd_imports(p) for p in PACKAGE.rglob("*.py")}


# Where each module's code runs. Keys are prefixes (the longest wins), "raysgd" itself only
# the package's __init__. common: pure, usable by both sides; face: public and legacy paths.
SIDES = {
    "raysgd": "face", "raysgd.utils": "face", "raysgd.torch": "face", "raysgd.data": "face",
    "raysgd.errors": "common", "raysgd.constants": "common", "raysgd.config": "common",
    "raysgd.recovery": "common", "raysgd.state": "common", "raysgd.commits": "common", "raysgd.storage": "common", "raysgd.strategy": "common", "raysgd.data.dataset_config": "common",
    "raysgd.worker": "worker", "raysgd.operator": "worker", "raysgd.creator_operator": "worker",
    "raysgd.lightning": "worker", "raysgd.function": "worker", "raysgd.data.shards": "worker",
    "raysgd.driver": "driver", "raysgd.trainer": "driver", "raysgd.tune": "driver",
    "raysgd.loggers": "driver", "raysgd.plot": "driver", "raysgd.data.feed": "driver",
    "raysgd.data.ray_collate": "driver",
    "raysgd.function.trainable": "driver",
}
MAY_IMPORT_SIDES = {"common": {"common"}, "worker": {"common", "worker"},
                    "driver": {"common", "worker", "driver"},
                    "face": {"common", "worker", "driver", "face"}}


def _side(module):
    keys = [k for k in SIDES if module == k or (k != "raysgd" and module.startswith(k + "."))]
    return SIDES[max(keys, key=len)] if keys else None


def test_every_module_has_a_side():
    assert [m for m in _graph() if _side(m) is None] == []


def test_worker_code_never_imports_driver_code():
    """Driver code may use worker code (a use_local rank 0 runs a WorkerRunner in the driver);
    worker code never imports driver code, pure code neither, and only faces import faces.
    Lazy imports count too."""
    offenders = sorted(f"{m} ({_side(m)}) -> {t} ({_side(t)})" for m, imports in _graph().items()
                       for t, _ in imports if _side(t) not in MAY_IMPORT_SIDES[_side(m)])
    assert offenders == []


# Folder (or top-level module) -> the folders and top-level modules it may import (itself
# always). The faces (raysgd/__init__, torch/) may import anything. Lazy imports count.
LAYERS = {
    "errors": set(), "constants": {"errors"}, "config": {"constants", "errors", "strategy", "state", "commits"},
    "strategy": {"errors"},
    "recovery": {"errors"}, "state": {"errors", "storage"}, "storage": {"errors"},
    "commits": {"errors"},
    "loggers": {"errors"}, "plot": {"errors"},
    "worker": {"errors", "constants", "config", "state", "storage", "strategy", "data", "operator",
               "commits"},
    "data": {"errors", "worker"},
    "operator": {"errors", "worker", "creator_operator", "lightning"},
    "creator_operator": {"errors", "operator", "worker"},
    "lightning": {"errors", "worker", "operator"},
    "driver": {"errors", "constants", "config", "recovery", "state", "commits", "storage",
               "worker", "data", "operator", "loggers"},
    "trainer": {"errors", "constants", "config", "recovery", "state", "storage", "strategy",
                "worker", "data", "operator", "driver", "tune", "commits"},
    "tune": {"errors", "config", "driver", "trainer", "worker"},
    "function": {"errors", "constants", "config", "state", "worker", "operator", "driver",
                 "trainer"},
    "utils": {"constants", "worker", "driver"},
}
FACES = {"raysgd", "torch"}


def _folder(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "raysgd"


def test_folders_import_only_the_layers_they_may():
    seen = {}
    for m, imports in _graph().items():
        folder = _folder(m)
        for t, _ in imports:
            if t != "raysgd" and _folder(t) != folder:
                seen.setdefault(folder, set()).add(_folder(t))
    assert set(seen) <= set(LAYERS) | FACES, "a new folder or top-level module: add it to LAYERS"
    offenders = {f: sorted(used - LAYERS[f]) for f, used in seen.items()
                 if f not in FACES and used - LAYERS[f]}
    assert offenders == {}


# The only lazy imports that point back up (the imported module reaches the importer again):
# legacy classmethods on the base classes that build an integration's subclass or trainable.
# Each stays lazy on purpose: Lightning is optional, and `import raysgd` must not load
# ray.tune; the subclass modules need the base class first.
LAZY_BACK_REFERENCES = {("raysgd.operator", "raysgd.creator_operator"),  # from_creators
                        ("raysgd.operator", "raysgd.lightning"),  # from_ptl
                        ("raysgd.trainer", "raysgd.tune")}  # as_trainable


def _reaches(graph, start, goal, lazy_too):
    todo, seen = [start], set()
    while todo:
        m = todo.pop()
        if m == goal:
            return True
        if m not in seen:
            seen.add(m)
            todo.extend(t for t, lazy in graph.get(m, ()) if lazy_too or not lazy)
    return False


def test_no_import_cycles_at_import_time():
    graph = _graph()
    cycles = sorted(f"{m} -> {t}" for m, imports in graph.items() for t, lazy in imports
                    if not lazy and t != m and _reaches(graph, t, m, lazy_too=False))
    assert cycles == []


def test_the_lazy_back_references_are_the_known_ones():
    graph = _graph()
    back = {(m, t) for m, imports in graph.items() for t, lazy in imports
            if lazy and _reaches(graph, t, m, lazy_too=True)}
    assert back == LAZY_BACK_REFERENCES


def test_loading_the_actor_class_imports_no_torch():
    """Ray loads raysgd.worker.actor to create every worker, spares included; torch comes
    only with the warm-up (or start()), so a spare answers its control thread at once (a
    dead rank's recovery probes it) and a GPU spare starts no CUDA before it has a device."""
    code = ("import sys, raysgd.worker.actor; "
            "print(sorted(m for m in ('torch', 'raysgd.worker.runner', 'raysgd.trainer') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
