"""A real pytorch_lightning 1.x: tests/lightning_v1_modules.py's V1Regressor (1.x module path,
training_step_end, training_epoch_end(outputs), validation_epoch_end(outputs), hooks with 1.x
signatures) trained by Lightning 1.x's own Trainer and by raysgd on 2 workers, compared.

The suite's environment has Lightning 2.x, so 1.x lives in a side directory that ``make
install`` fills (``pip install --target .venv-ptl1 --no-deps pytorch_lightning==1.8.6 ...``;
RAYSGD_PTL1_PATH points elsewhere). The driver runs in a subprocess with that directory first
on PYTHONPATH, on this session's Ray with the same PYTHONPATH for its workers.
"""
import glob
import json
import os
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
SIDE_DIR = os.environ.get("RAYSGD_PTL1_PATH", os.path.join(ROOT, ".venv-ptl1"))
FOUND = glob.glob(os.path.join(SIDE_DIR, "pytorch_lightning-1.*.dist-info"))

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not FOUND, reason=f"pytorch_lightning 1.x is not installed in {SIDE_DIR} "
                                         "(`make install` puts 1.8.6 there; or set "
                                         "RAYSGD_PTL1_PATH to a `pip install --target` of it)"),
]


@pytest.fixture(scope="module")
def runs(ray_session):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [SIDE_DIR, TESTS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]),
        RAYSGD_TEST_RAY_ADDRESS=ray_session.get_runtime_context().gcs_address)
    out = subprocess.run([sys.executable, os.path.join(TESTS, "lightning_v1_driver.py")],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_1x_module_ran_on_lightning_1x_in_both(runs, ray_cpus):  # its CPUs came back
    assert runs["lightning"]["version"].startswith("1.")
    assert len(runs["raysgd"]["reports"]) == 2  # one per worker


def test_epoch_end_hooks_get_the_step_outputs_as_lightning_1x_passes_them(runs):
    expected = runs["lightning"]["epoch_ends"]  # one process: 8 train, 4 validation batches
    for report in runs["raysgd"]["reports"]:  # two workers: half the batches each
        got = report["epoch_ends"]
        assert sorted(h for h, _ in got) == sorted(h for h, _ in expected)
        for (hook, seen), (_, lightning) in zip(sorted(got, key=str), sorted(expected, key=str)):
            assert seen["count"] * 2 == lightning["count"], hook
            assert {k: v for k, v in seen.items() if k != "count"} == \
                {k: v for k, v in lightning.items() if k != "count"}, hook


def test_hooks_get_their_1x_arguments(runs):
    for report in runs["raysgd"]["reports"]:
        assert report["calls"] == runs["lightning"]["calls"]


def test_result_keys_cover_lightnings_callback_metrics_and_plateau_monitors_an_epoch_key(runs):
    train, val = runs["raysgd"]["results"][2:]
    assert set(runs["lightning"]["callback_metrics"]) <= set(train) | set(val)
    assert train["train_mse_epoch"] == train["train_mse"]  # the call's average
    assert train["train_mse_step"] == train["last_train_mse"]  # its last batch
    assert val["val_samples"] == 128  # each worker validated half of the 256 samples
    # ReduceLROnPlateau(monitor="val_mse_epoch", mode="max"): the loss fell, so it halved once.
    assert runs["raysgd"]["lrs"] == [runs["lightning"]["lr"]] * 2 == [0.025, 0.025]
    first, second = runs["raysgd"]["results"][0], runs["raysgd"]["results"][2]
    assert second["train_mse"] < first["train_mse"]
