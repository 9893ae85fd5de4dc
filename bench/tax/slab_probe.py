"""Probe for issue 47's memory bar: a commit copied in place into a shared-memory slab that
a keeper actor holds, against ``ray.put`` of the same state (how commits are stored today).

``python -m bench.tax.slab_probe [GiB]`` (default 1.6, the large cell's state): six commits
each way from one rank actor, with wall and CPU seconds per commit and the machine's shared
memory (``Shmem`` in /proc/meminfo, which holds Ray's object store too) after each; then
whether the slab's content outlives the rank's process and whether the keeper's end frees
it. A measurement of a design not built yet, not part of ``make bench-tax``.
"""
import mmap
import os
import sys
import time

import ray
import torch

GB = float(sys.argv[1]) if len(sys.argv) > 1 else 1.6
N = int(GB * 2**30) // 4 * 4
REPS = 6


def shmem_mb():
    for line in open("/proc/meminfo"):
        if line.startswith("Shmem:"):
            return int(line.split()[1]) // 1024


@ray.remote
class Keeper:
    """Holds an anonymous shared-memory file (memfd): it goes when this process does."""

    def __init__(self, nbytes):
        self.fd = os.memfd_create("raysgd-slab")
        os.ftruncate(self.fd, nbytes)

    def where(self):
        return os.getpid(), self.fd

    def read_sum(self, nbytes):
        with mmap.mmap(self.fd, nbytes) as m:
            t = torch.frombuffer(m, dtype=torch.float32)
            s = float(t[:1000].sum())
            del t
        return s


@ray.remote
class Rank:
    def __init__(self):
        torch.manual_seed(0)
        self.state = torch.randn(N // 4)

    def slab_commits(self, pid, fd):
        """Map the keeper's file through /proc (same node, same user) and commit into it."""
        fdn = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        m = mmap.mmap(fdn, N)
        slab = torch.frombuffer(m, dtype=torch.float32)
        out = []
        for _ in range(REPS):
            t = time.perf_counter(); c = time.process_time()
            slab.copy_(self.state)
            self.state.add_(1e-3)
            out.append((time.perf_counter() - t, time.process_time() - c, shmem_mb()))
        expect = float(self.state[:1000].sum()) - 1000 * 1e-3
        del slab
        m.close(); os.close(fdn)
        return out, expect

    def put_commits(self):
        out, ref = [], None
        for _ in range(REPS):
            t = time.perf_counter(); c = time.process_time()
            new = ray.put(self.state)
            ref = new  # the previous commit is dropped only once the new one exists
            self.state.add_(1e-3)
            out.append((time.perf_counter() - t, time.process_time() - c, shmem_mb()))
        return out


if __name__ == "__main__":
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    base = shmem_mb()
    keeper = Keeper.remote(N)
    pid, fd = ray.get(keeper.where.remote())
    rank = Rank.remote()
    slab, expect = ray.get(rank.slab_commits.remote(pid, fd))
    ray.kill(rank)  # the rank dies: the slab lives on in the keeper
    time.sleep(1)
    survived = abs(ray.get(keeper.read_sum.remote(N)) - expect) < 1e-2
    print(f"state {N / 2**30:.2f} GiB; shmem before {base} MB")
    print("slab copy_: wall s, cpu s, shmem MB:", [(round(w, 3), round(c, 3), s) for w, c, s in slab])
    print("slab content survives the rank's death:", survived)
    ray.kill(keeper); time.sleep(1)
    print("shmem after the keeper went:", shmem_mb(), "MB")
    rank = Rank.remote()
    puts = ray.get(rank.put_commits.remote())
    print("ray.put: wall s, cpu s, shmem MB:", [(round(w, 3), round(c, 3), s) for w, c, s in puts])
    ray.shutdown()
