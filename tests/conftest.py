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
    """Fails a test that leaks workers: all 4 CPUs must come back after it, except those
    idle warm workers keep reserved for the next trainer (raysgd.driver.pool)."""
    yield ray_session
    import time

    from raysgd import idle_workers

    def free_or_pooled() -> float:
        pooled = idle_workers()["reserved"].get("CPU", 0.0)
        return ray_session.available_resources().get("CPU", 0) + pooled

    deadline = time.monotonic() + 10
    while free_or_pooled() < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert free_or_pooled() == 4, (
        f"test leaked workers or placement groups: {ray_session.available_resources()}, "
        f"idle: {idle_workers()}")


@pytest.fixture
def trainer_factory(ray_cpus):
    """Builds TorchTrainers (2 CPU workers, LinearOperator by default); shuts them all down after."""
    from operators_for_tests import LinearOperator
    from raysgd import TorchTrainer

    made = []

    def factory(operator=LinearOperator, **kwargs):
        kwargs.setdefault("num_workers", 2)
        kwargs.setdefault("use_gpu", False)
        trainer = TorchTrainer(training_operator_cls=operator, **kwargs)
        made.append(trainer)
        return trainer

    yield factory
    for trainer in made:
        trainer.shutdown()


# The fixtures through which a test waits for a run of the background batch.
WAITS_FOR_BACKGROUND = ("bench_quick", "scripts")


def _waits_for_background(item) -> bool:
    return any(name in getattr(item, "fixturenames", ()) for name in WAITS_FOR_BACKGROUND)


def pytest_collection_modifyitems(session, config, items):
    """The tests that wait for a background run go last: until then their runs use the CPU
    that the in-process tests leave idle (``background``)."""
    items[:] = ([item for item in items if not _waits_for_background(item)]
                + [item for item in items if _waits_for_background(item)])


@pytest.fixture(scope="session")
def background(request, tmp_path_factory):
    """The session's one :class:`background.Batch`: the benchmarks' quick runs
    (``bench_runs``) and the example scripts' runs (``example_runs``) that this session's
    tests wait for, longest first; ``background.result(name, timeout)``."""
    from background import Batch
    from bench_runs import quick_jobs
    from example_runs import TEST_MODULE, example_jobs

    modules = {os.path.splitext(os.path.basename(str(item.fspath)))[0]
               for item in request.session.items if _waits_for_background(item)}
    jobs = quick_jobs(str(tmp_path_factory.mktemp("bench-quick")), modules)
    if TEST_MODULE in modules:
        examples = example_jobs(tmp_path_factory)
        assert not set(jobs) & set(examples), "a run name is taken twice"
        jobs.update(examples)
    batch = Batch(jobs)
    yield batch
    batch.close()


@pytest.fixture(scope="session", autouse=True)
def _background_started(request):
    """Starts the background runs with the session's first test, when any test waits for
    one."""
    if any(_waits_for_background(item) for item in request.session.items):
        request.getfixturevalue("background").start()


@pytest.fixture
def bench_quick(background):
    """The background batch, for the benchmarks' smoke tests: ``bench_quick.result(name,
    timeout)`` is the ``bench_runs.QuickRun`` of ``bench_runs.QUICK_RUNS[name]``."""
    return background
