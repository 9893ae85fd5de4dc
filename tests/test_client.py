"""Ray Client drivers (``ray.init("ray://...")``), as Ray 1.12's sgd/tests/test_client.py.

The cases run in a process of their own: disconnecting the in-process client
server shuts that process's Ray down, which would end the session's shared Ray.
They share one such process (one client session, each case in turn, each
reporting its own outcome): a Ray start and a client server cost seconds.
"""
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("grpc", reason="Ray Client needs grpcio (pip install 'ray[client]')")

PRELUDE = textwrap.dedent("""
    import os, sys, tempfile
    import ray, torch
    from torch import nn
    from ray._private.client_mode_hook import enable_client_mode
    from ray.util.client.ray_client_helpers import ray_start_client_server
    from raysgd import TorchTrainer
    from raysgd.errors import ConfigError
    from raysgd.torch import TrainingOperator
    from raysgd.torch.examples.train_example import data_creator, model_creator, optimizer_creator
    from raysgd.utils import BATCH_SIZE

    Operator = TrainingOperator.from_creators(model_creator, optimizer_creator,
                                              data_creator=data_creator, loss_creator=nn.MSELoss)
    CHECKPOINT_DIR = sys.argv[1]
    ray.init(num_cpus=4, include_dashboard=False)
    with ray_start_client_server() as client, enable_client_mode():  # the driver is a client
        assert client.is_connected() and type(ray.put(1)).__name__ == "ClientObjectRef"
""")


# One case, inside the client session: its own outcome, whatever the other one did.
CASE = """
print("CASE-BEGIN {name}", flush=True)
try:
{body}
except BaseException:
    import traceback
    traceback.print_exc(file=sys.stdout)
    print("CASE-FAILED {name}", flush=True)
else:
    print("CASE-DONE {name}", flush=True)
"""

# Run in this order; the rejection starts no worker, so the training case finds the
# client session as a process of its own would.
CASES = {
    "use_local": """
        try:
            TorchTrainer(training_operator_cls=Operator, num_workers=2, use_local=True,
                         use_gpu=False)
        except ValueError as exc:  # ConfigError, as legacy's ValueError
            assert isinstance(exc, ConfigError) and "Ray Client" in str(exc), exc
            print("REJECTED")
    """,
    "train": """
        trainer = TorchTrainer(training_operator_cls=Operator, num_workers=2, use_gpu=False,
                               checkpoint_every_n_steps=4, config={BATCH_SIZE: 32})
        for _ in range(2):
            trainer.train()
        before = trainer.validate()["val_loss"]
        assert isinstance(trainer.get_model(to_cpu=True), nn.Linear)
        path = trainer.save(os.path.join(CHECKPOINT_DIR, "ckpt.pt"))
        trainer.load(path)
        assert abs(trainer.validate()["val_loss"] - before) < 1e-6
        trainer.shutdown()
        print("CLIENT-TRAIN-OK")
    """,
}


@pytest.fixture(scope="module")
def client_run(tmp_path_factory) -> str:
    """The stdout of one client session that ran every case in ``CASES``."""
    script = PRELUDE
    for name, body in CASES.items():
        case = CASE.format(name=name, body=textwrap.indent(textwrap.dedent(body), " " * 4))
        script += textwrap.indent(case, " " * 4)
    directory = str(tmp_path_factory.mktemp("client"))
    done = subprocess.run([sys.executable, "-c", script, directory], capture_output=True,
                          text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def case_output(stdout: str, name: str) -> str:
    """What case ``name`` printed; fails with its traceback if it raised."""
    assert f"CASE-BEGIN {name}\n" in stdout, stdout[-3000:]
    out = stdout.split(f"CASE-BEGIN {name}\n", 1)[1].split("CASE-BEGIN ", 1)[0]
    assert f"CASE-DONE {name}" in out, out[-3000:]
    return out


def test_train_validate_save_load_through_ray_client(client_run):
    assert "CLIENT-TRAIN-OK" in case_output(client_run, "train")


def test_use_local_is_rejected_under_ray_client(client_run):
    assert "REJECTED" in case_output(client_run, "use_local")
