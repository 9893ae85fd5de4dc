"""The warm worker pool on a real Ray: reuse without leaks, discarding, reaping, shutdown."""
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from operators_for_tests import LinearOperator, RaisingOperator
from raysgd import idle_workers, release_idle_workers
from raysgd.utils import BATCH_SIZE
from raysgd.worker import huge_pages
from raysgd.worker.actor import COMMIT_WAIT_S

pytestmark = pytest.mark.timeout(300)

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has ended: its parent just has not reaped it yet)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_dead(pids, timeout_s=15.0) -> list:
    deadline = time.monotonic() + timeout_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


def pids(trainer):
    return trainer.apply_all_workers(os.getpid)


def fresh_torch_seed() -> int:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.initial_seed())"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def dirty_hook():
    """A hook that changes process state a later trainer must not see."""
    import numpy as np

    os.environ["RAYSGD_TEST_LEFT_BEHIND"] = "1"
    os.chdir("/tmp")
    torch.manual_seed(123)
    np.random.seed(0)


def clean_hook():
    """Records what the process looks like before the operator's setup seeds anything."""
    import numpy as np

    os.environ["RAYSGD_TEST_SECOND_HOOK"] = f"{torch.initial_seed()} {np.random.rand()}"


def process_view():
    import torch.distributed as dist

    torch_seed, numpy_draw = os.environ["RAYSGD_TEST_SECOND_HOOK"].split()
    return {"left_behind": os.environ.get("RAYSGD_TEST_LEFT_BEHIND"), "cwd": os.getcwd(),
            "torch_seed": int(torch_seed), "numpy_draw": float(numpy_draw),
            "dist": dist.is_initialized()}


def test_a_second_trainer_reuses_the_processes_and_sees_nothing_of_the_first(trainer_factory):
    first = trainer_factory(initialization_hook=dirty_hook, config={"lr": 0.1})
    first.train()
    first_pids = pids(first)
    cwd = os.getcwd()
    first.shutdown()
    assert idle_workers()["workers"] == 3  # two ranks and the spare

    second = trainer_factory(initialization_hook=clean_hook)
    assert pids(second) == first_pids
    views = second.apply_all_workers(process_view)
    for view in views:
        assert view["left_behind"] is None and view["cwd"] == cwd
        assert view["dist"]  # the new trainer's own process group
    # Seeded from entropy as in a new process: not the first trainer's seeds, and each
    # process its own (a fresh interpreter's torch seed is random too).
    seeds = [view["torch_seed"] for view in views]
    assert 123 not in seeds and len(set(seeds)) == 2 and fresh_torch_seed() not in seeds
    assert len({view["numpy_draw"] for view in views}) == 2  # seed 0 on both would repeat
    # The operator is new: training starts from the operator's fresh state.
    assert second.train()["epoch"] == 1
    assert idle_workers()["workers"] == 0


def test_a_second_trainers_call_does_not_wait_for_the_first_trainers_commit_request(
        trainer_factory):
    """The first trainer's last commit request (a long poll) waited on in its released
    runner and held one of the process's two commit threads into the second trainer; the
    second's first call then left a request behind that took its next call's first commit,
    which no driver acknowledged, and the ranks waited COMMIT_WAIT_S (10 s) before their
    next batch."""
    config = {"data_size": 512, BATCH_SIZE: 32}  # 8 steps a call, a commit every 2
    first = trainer_factory(checkpoint_every_n_steps=2, config=config)
    first.train()
    first.shutdown()
    second = trainer_factory(checkpoint_every_n_steps=2, config=config)
    assert second.train()["epoch"] == 1
    started = time.monotonic()
    assert second.train()["epoch"] == 2
    assert time.monotonic() - started < 0.6 * COMMIT_WAIT_S  # a call takes well under 1 s


def thread_niceness(pid: int) -> set:
    """The niceness of every thread of process ``pid`` (threads that end meanwhile skipped)."""
    seen = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            seen.add(os.getpriority(os.PRIO_PROCESS, int(tid)))
        except ProcessLookupError:
            pass
    return seen


def may_raise_priority_to(nice: int) -> bool:
    import resource
    return os.geteuid() == 0 or resource.getrlimit(resource.RLIMIT_NICE)[0] >= 20 - nice


def test_the_default_spare_goes_only_where_a_cpu_is_free_and_runs_at_the_ranks_niceness(
        trainer_factory):
    """Two 1-CPU workers on the 4-CPU node leave two CPUs free: the default keeps one spare
    there. The spare and every thread of a rank run at the driver's niceness
    (raysgd.worker.priority) where the OS allows, and a released process goes back to Ray's
    worker niceness. Two 2-CPU workers reserve every CPU: no spare (a dead rank is then taken
    by a new process)."""
    import ray

    release_idle_workers()  # earlier tests' idle spares would be adopted
    roomy = trainer_factory()
    roomy.train()  # the first commit starts the spare
    spare, = roomy._supervisor.group.spares
    info = ray.get(spare.actor.node_info.remote())
    assert ray.get(spare.ready, timeout=120) == info["node_id"]  # warm, and where it runs
    pid = info["pid"]
    rank_pid = pids(roomy)[0]
    assert os.sched_getscheduler(pid) == os.SCHED_OTHER
    driver = os.getpriority(os.PRIO_PROCESS, 0)
    rays = 15  # Ray's default worker_niceness
    expected = {driver} if may_raise_priority_to(driver) else {rays}
    assert thread_niceness(rank_pid) == expected and thread_niceness(pid) == expected
    roomy.shutdown()
    assert thread_niceness(rank_pid) == {rays}  # idle in the pool: Ray's again
    release_idle_workers()

    full = trainer_factory(num_cpus_per_worker=2)
    full.train()
    full.train()
    assert full._supervisor.group.spares == []
    assert idle_workers()["workers"] == 0


def test_a_bad_rank_niceness_is_refused_before_any_worker_starts(trainer_factory, monkeypatch):
    from raysgd.errors import ConfigError

    release_idle_workers()
    monkeypatch.setenv("RAYSGD_RANK_NICENESS", "high")
    with pytest.raises(ConfigError, match="RAYSGD_RANK_NICENESS='high'"):
        trainer_factory()
    assert idle_workers()["workers"] == 0


def faults_filling_64_mib() -> int:
    """In a rank: the page faults that filling a new 64 MiB tensor takes (16 384 in 4 KiB
    pages, 32 in huge pages)."""
    def faults() -> int:
        with open("/proc/self/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[7])
    before = faults()
    torch.empty(16 * 2**20).fill_(1.0)
    return faults() - before


def infos(trainer) -> list:
    import ray
    return ray.get([actor.node_info.remote() for actor in trainer._supervisor.group.actors])


@pytest.mark.skipif(not huge_pages.kernel_offers(), reason="this kernel has no huge pages")
def test_ranks_fill_large_tensors_in_huge_pages_unless_the_driver_says_not_to(
        trainer_factory, monkeypatch):
    """The default: every rank's torch asks for huge pages (raysgd.worker.huge_pages), so a
    new 64 MiB tensor takes a few dozen faults, not 16 384. With RAYSGD_HUGE_PAGES=0 the next
    trainer starts processes of its own (a pooled one keeps its allocator for life) and they
    fault per 4 KiB page."""
    release_idle_workers()
    default = trainer_factory(spare_workers=0)
    assert [info["huge_pages"] for info in infos(default)] == [True, True]
    assert max(default.apply_all_workers(faults_filling_64_mib)) < 2048
    huge_pids = pids(default)
    default.shutdown()
    assert idle_workers()["workers"] == 2

    monkeypatch.setenv(huge_pages.ENV, "0")
    small = trainer_factory(spare_workers=0)
    assert not set(pids(small)) & set(huge_pids)
    assert [info["huge_pages"] for info in infos(small)] == [False, False]
    assert min(small.apply_all_workers(faults_filling_64_mib)) >= 8192
    small.shutdown()
    release_idle_workers()


def malloc_arenas() -> tuple:
    """In a worker: its ``MALLOC_ARENA_MAX`` and how many malloc arenas glibc has made (from
    ``malloc_stats``, which writes to file descriptor 2)."""
    import ctypes
    import tempfile

    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            ctypes.CDLL(None).malloc_stats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        stats = out.read().decode()
    return os.environ.get("MALLOC_ARENA_MAX"), stats.count("Arena ")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")
def test_ranks_start_with_one_malloc_arena_unless_the_driver_says_not_to(
        trainer_factory, monkeypatch):
    """The default: every rank's process starts with MALLOC_ARENA_MAX=1 (raysgd.worker.
    malloc_arena), so its training thread, one of Ray's, shares the main arena: glibc has
    made one arena however many threads allocated. With RAYSGD_ONE_ARENA=0 the next trainer
    starts processes of its own (a pooled one keeps its arenas for life), with an arena per
    thread."""
    release_idle_workers()
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    default = trainer_factory(spare_workers=0)
    default.train(num_steps=2)
    assert default.apply_all_workers(malloc_arenas) == [("1", 1), ("1", 1)]
    one_arena_pids = pids(default)
    default.shutdown()

    monkeypatch.setenv("RAYSGD_ONE_ARENA", "0")
    plain = trainer_factory(spare_workers=0)
    plain.train(num_steps=2)
    assert not set(pids(plain)) & set(one_arena_pids)
    arenas = plain.apply_all_workers(malloc_arenas)
    assert [env for env, _ in arenas] == [None, None]
    assert min(count for _, count in arenas) > 1
    plain.shutdown()
    release_idle_workers()


class OtherModuleOperator(LinearOperator):
    """An operator of another module (this one) than the pooled processes ran before."""


def threads():
    return torch.get_num_threads()


def test_a_trainer_of_another_size_takes_the_idle_processes_it_can_seat_and_starts_the_rest(
        trainer_factory):
    release_idle_workers()  # earlier tests' idle workers: only this test's are counted
    first = trainer_factory(num_workers=2, spare_workers=0, num_cpus_per_worker=2)
    old = pids(first)
    assert first.apply_all_workers(threads) == [2, 2]
    first.shutdown()
    # Larger, one CPU each, another operator's module: both processes serve it, one is new,
    # and none keeps the 2 threads the first trainer gave it.
    larger = trainer_factory(OtherModuleOperator, num_workers=3, spare_workers=0)
    three = pids(larger)
    assert three[:2] == old and three[2] not in old
    assert larger.apply_all_workers(threads) == [1, 1, 1]
    assert larger.train()["num_samples"] > 0
    larger.shutdown()
    assert idle_workers()["workers"] == 3
    # Smaller: one process trains, another is its spare, the third waits in the pool.
    smaller = trainer_factory(num_workers=1, spare_workers=1)
    assert pids(smaller)[0] in three
    assert idle_workers()["workers"] == 1
    assert smaller.train()["num_samples"] > 0
    smaller.shutdown()
    assert idle_workers()["workers"] == 3
    assert wait_dead(three, timeout_s=0.5) == three  # all of them still run, idle


@pytest.mark.parametrize("how", ["reuse_workers=False", "shutdown(force=True)"])
def test_opting_out_kills_the_workers(trainer_factory, how):
    release_idle_workers()  # earlier tests' idle workers
    trainer = trainer_factory(reuse_workers=how != "reuse_workers=False")
    old = pids(trainer)
    trainer.shutdown(force=how == "shutdown(force=True)")
    assert idle_workers()["workers"] == 0
    assert wait_dead(old) == []


def test_a_worker_that_died_while_idle_is_replaced(trainer_factory):
    first = trainer_factory()
    old = pids(first)
    first.shutdown()
    os.kill(old[1], 9)
    assert wait_dead([old[1]]) == []
    second = trainer_factory()
    assert pids(second)[0] == old[0] and old[1] not in pids(second)  # only the dead one is new
    assert second.train()["num_samples"] > 0


def test_workers_of_a_trainer_whose_user_code_raised_are_reused_healthy(trainer_factory):
    failing = trainer_factory(operator=RaisingOperator)
    failing.apply_all_operators(lambda op: setattr(op, "fail_ranks", (0, 1)) or
                                setattr(op, "fail_step", 2))
    with pytest.raises(KeyError):
        failing.train()
    old = pids(failing)
    failing.shutdown()
    healthy = trainer_factory()
    assert pids(healthy) == old
    assert healthy.train()["num_samples"] > 0


DRIVER = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {tests!r})
    import ray
    from operators_for_tests import LinearOperator
    from raysgd import TorchTrainer, idle_workers

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(training_operator_cls=LinearOperator, num_workers=2, use_gpu=False)
    workers = trainer.apply_all_workers(os.getpid)
    trainer.shutdown()
    report = {{"workers": workers, "idle_after_shutdown": idle_workers()["workers"]}}
    ray.shutdown()
    report["idle_after_ray_shutdown"] = idle_workers()["workers"]
    print("REPORT", json.dumps(report), flush=True)
""")


def run_driver():
    out = subprocess.run([sys.executable, "-c", DRIVER.format(tests=TESTS_DIR)],
                         capture_output=True, text=True, timeout=240)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("REPORT ")]
    assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-3000:]
    import json

    return json.loads(line[0][len("REPORT "):])


@pytest.mark.slow
def test_the_pool_is_empty_after_ray_shutdown_and_no_worker_outlives_the_driver():
    report = run_driver()
    assert report["idle_after_shutdown"] == 3
    assert report["idle_after_ray_shutdown"] == 0
    assert wait_dead(report["workers"]) == []


@pytest.mark.slow
def test_idle_workers_are_stopped_after_the_idle_timeout(trainer_factory, monkeypatch):
    # On the session's Ray (a driver process of its own would cost a Ray start): the pool
    # reads the timeout whenever it parks or reaps a crew, so the variable counts from here.
    monkeypatch.setenv("RAYSGD_IDLE_WORKER_TIMEOUT_S", "1.0")
    release_idle_workers()  # earlier tests' idle workers: only this trainer's are counted
    trainer = trainer_factory()
    workers = pids(trainer)
    trainer.shutdown()
    assert idle_workers()["workers"] == 3

    def running():
        return [pid for pid in workers if os.path.exists(f"/proc/{pid}")]

    # The timeout (1 s) and then some, for a busy machine: the default (300 s) would stop
    # nothing in this time.
    deadline = time.monotonic() + 10.0
    while (idle_workers()["workers"] or running()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert idle_workers()["workers"] == 0
    assert running() == []


def test_a_spare_takes_the_node_it_reports_once_warm(ray_session):
    """A CPU spare's node is only asked of Ray (soft affinity): once warm, the node it
    reports is the one ranks and drains are matched against."""
    from raysgd.driver.warm import Spare

    moved = Spare(actor=None, ready=ray_session.put("node-b"), node="node-a")
    assert moved.node_now() == "node-b" and not moved.failed()
    unnamed = Spare(actor=None, ready=ray_session.put(True), node="node-a")  # no node said
    assert unnamed.node_now() == "node-a" and not unnamed.failed()

    @ray_session.remote
    def dies():
        raise RuntimeError("warm-up failed")

    dead = Spare(actor=None, ready=dies.remote(), node="node-a")
    ray_session.wait([dead.ready])
    assert dead.failed() and dead.node_now() == "node-a"
