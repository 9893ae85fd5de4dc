import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# Ray workers import test helper modules (operators_for_tests) by name, so
# the tests directory must be on their path; set before ray.init starts them.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (TESTS_DIR, os.environ.get("PYTHONPATH", "")) if p)
if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)


@pytest.fixture(scope="session")
def ray_session():
    """One embedded Ray for the whole session (each ray.init costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def ray_cpus(ray_session):
    """Fails a test that leaks actors or placement groups."""
    yield ray_session
    from ray.util.state import list_actors

    alive = [a for a in list_actors(filters=[("state", "=", "ALIVE")])
             if a.class_name == "_WorkerActor"]
    assert not alive, f"test leaked raysgd worker actors: {alive}"
