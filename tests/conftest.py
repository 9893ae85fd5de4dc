import os
import shutil
import sys
import tempfile

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
        # address="local": a new Ray of its own, never one a benchmark's or a script's
        # ray.cluster_utils.Cluster left in /tmp/ray/ray_current_cluster.
        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
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


def _module(item) -> str:
    return os.path.splitext(os.path.basename(str(item.fspath)))[0]


_BENCH_QUICK = pytest.StashKey()  # (the session's background jobs, the quick runs' JSON folder)


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(session, config, items):
    """The benchmarks' smoke tests run last: their quick runs go on beside everything
    before them (``pytest_collection_finish``), and the suite waits for them at the end."""
    from bench_runs import smoke_modules

    smoke = smoke_modules()
    items.sort(key=lambda item: _module(item) in smoke)  # stable: the order is kept otherwise


def pytest_collection_finish(session):
    """Start the background jobs the collected tests will ask for, one at a time, as the
    session starts: the first benchmark quick run (``bench_runs``), the multi-node scripts
    (``cluster_scripts``: their tests come early in the suite and wait without widening),
    then the other quick runs; the first smoke test, at the suite's end, widens them to two.
    Their environment is this process's now (a test may change it later)."""
    from background import Batch
    from bench_runs import quick_jobs
    from cluster_scripts import cluster_jobs

    modules = {_module(item) for item in session.items}
    out_dir = tempfile.mkdtemp(prefix="raysgd-bench-quick-")
    quick = list(quick_jobs(out_dir, modules).items())
    jobs = {**dict(quick[:1]), **cluster_jobs(modules), **dict(quick[1:])}
    if session.config.option.collectonly or not jobs:
        shutil.rmtree(out_dir, ignore_errors=True)
        return
    runs = Batch(jobs, env=dict(os.environ))
    runs.start(width=1)
    session.config.stash[_BENCH_QUICK] = (runs, out_dir)


def pytest_terminal_summary(terminalreporter):
    """When each background job (``background.Batch``: benchmarks' quick runs, example
    scripts, the guides' pages) started and ended in the session."""
    from background import RUNS

    if RUNS:
        terminalreporter.section("background jobs (s from the session's start)")
        for label, began, ended in sorted(RUNS, key=lambda run: run[1]):
            terminalreporter.write_line(f"{began:7.0f} {ended:7.0f} {ended - began:6.0f}  {label}")


def pytest_sessionfinish(session):
    runs, out_dir = session.config.stash.get(_BENCH_QUICK, (None, None))
    if runs is not None:
        runs.close()
        shutil.rmtree(out_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def bench_quick(request):
    """The session's background jobs (``pytest_collection_finish``), started with the
    session: ``bench_quick.result(name, timeout)`` for a benchmark's quick run
    (``bench_runs``), ``cluster_scripts.cluster_result(bench_quick, script)`` for a
    multi-node script's."""
    return request.config.stash[_BENCH_QUICK][0]


@pytest.fixture(scope="session")
def s3_endpoint():
    """A local S3 endpoint (moto) for the whole session; this process's environment points
    pyarrow at it, as AWS_ENDPOINT_URL and the credentials variables do for users."""
    from s3_server import S3Endpoint

    endpoint = S3Endpoint()
    endpoint.start()
    saved = {key: os.environ.get(key) for key in endpoint.env}
    os.environ.update(endpoint.env)
    yield endpoint
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if endpoint.running:
        endpoint.stop()


@pytest.fixture
def s3_run(s3_endpoint):
    """``s3://<a new bucket>/run``: a run directory no other test shares."""
    if not s3_endpoint.running:
        s3_endpoint.start()
    return f"s3://{s3_endpoint.new_bucket()}/run"
