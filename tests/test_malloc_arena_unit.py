"""One malloc arena for a rank's process (raysgd.worker.malloc_arena): the driver's setting
and the actor options that carry it. No Ray."""
import pytest

from raysgd.errors import ConfigError
from raysgd.worker import malloc_arena
from raysgd.worker.process_start import ProcessStart


@pytest.mark.parametrize("environ, want", [
    ({}, True), ({"RAYSGD_ONE_ARENA": ""}, True), ({"RAYSGD_ONE_ARENA": " On "}, True),
    ({"RAYSGD_ONE_ARENA": "0"}, False), ({"RAYSGD_ONE_ARENA": "false"}, False),
    # The user's own MALLOC_ARENA_MAX wins, whatever it says.
    ({"MALLOC_ARENA_MAX": "4"}, False), ({"MALLOC_ARENA_MAX": "4", "RAYSGD_ONE_ARENA": "1"}, False)])
def test_the_driver_wants_one_arena_unless_told_not_to_or_the_user_chose(environ, want):
    assert malloc_arena.wanted(environ) is want


def test_a_bad_setting_says_what_to_use():
    with pytest.raises(ConfigError, match="RAYSGD_ONE_ARENA='maybe'.*use 1 .* or 0"):
        malloc_arena.wanted({"RAYSGD_ONE_ARENA": "maybe"})


def test_the_setting_reaches_the_process_through_its_actor_options(monkeypatch):
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("RAYSGD_ONE_ARENA", raising=False)
    start = ProcessStart.decide()
    assert start.one_arena
    assert start.actor_options() == {"runtime_env": {"env_vars": {"MALLOC_ARENA_MAX": "1"}}}
    monkeypatch.setenv("RAYSGD_ONE_ARENA", "0")
    off = ProcessStart.decide()
    assert off.actor_options() == {}  # Ray's prestarted processes serve as they are
    # Processes started otherwise never serve each other's trainers from the pool.
    assert start.allocator() != off.allocator()


def test_trim_hands_back_what_the_heap_freed_in_its_middle():
    """Blocks freed below one still in use stay in the process (glibc trims only the heap's
    top by itself); ``trim`` gives their pages back. In a new interpreter, so that nothing
    else in it allocates meanwhile."""
    import os
    import subprocess
    import sys

    script = """
import os
from raysgd.worker import malloc_arena

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

blocks = [bytearray(100_000) for _ in range(2000)]  # 200 MB under the mmap threshold
keep = bytearray(100_000)  # above them: the freed blocks are not the heap's top
before = rss_mib()
del blocks
freed = rss_mib()
malloc_arena.trim()
print(before, freed, rss_mib())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, env={**os.environ, "MALLOC_ARENA_MAX": "1"})
    before, freed, trimmed = map(float, out.stdout.split())
    if malloc_arena._LIBC is None:
        pytest.skip("not glibc: nothing to trim")
    assert freed > before - 50, (before, freed)  # freed, but still the process's
    assert trimmed < freed - 150, (before, freed, trimmed)
