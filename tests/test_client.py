"""Ray Client drivers (``ray.init("ray://...")``), as Ray 1.12's sgd/tests/test_client.py.

Each case runs in its own process: disconnecting the in-process client server
shuts that process's Ray down, which would end the session's shared Ray.
"""
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("grpc", reason="Ray Client needs grpcio (pip install 'ray[client]')")

PRELUDE = textwrap.dedent("""
    import os, tempfile
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
    ray.init(num_cpus=4, include_dashboard=False)
    with ray_start_client_server() as client, enable_client_mode():  # the driver is a client
        assert client.is_connected() and type(ray.put(1)).__name__ == "ClientObjectRef"
""")


def run_as_client(body: str, timeout: int = 240) -> str:
    script = PRELUDE + textwrap.indent(textwrap.dedent(body), " " * 4)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_train_validate_save_load_through_ray_client(tmp_path):
    out = run_as_client(f"""
        trainer = TorchTrainer(training_operator_cls=Operator, num_workers=2, use_gpu=False,
                               checkpoint_every_n_steps=4, config={{BATCH_SIZE: 32}})
        for _ in range(2):
            trainer.train()
        before = trainer.validate()["val_loss"]
        assert isinstance(trainer.get_model(to_cpu=True), nn.Linear)
        path = trainer.save(os.path.join({str(tmp_path)!r}, "ckpt.pt"))
        trainer.load(path)
        assert abs(trainer.validate()["val_loss"] - before) < 1e-6
        trainer.shutdown()
        print("CLIENT-TRAIN-OK")
    """)
    assert "CLIENT-TRAIN-OK" in out


def test_use_local_is_rejected_under_ray_client():
    out = run_as_client("""
        try:
            TorchTrainer(training_operator_cls=Operator, num_workers=2, use_local=True,
                         use_gpu=False)
        except ValueError as exc:  # ConfigError, as legacy's ValueError
            assert isinstance(exc, ConfigError) and "Ray Client" in str(exc), exc
            print("REJECTED")
    """)
    assert "REJECTED" in out
