"""Probe behind issue 47's slabs: raysgd's own commit path into the driver's slabs
(``raysgd.driver.slabs.CommitSlabs`` choosing the slot, ``raysgd.worker.slab_writer``
copying) against ``ray.put`` of the same state (how commits were stored before).

``python -m bench.tax.slab_probe [GiB]`` (default 1.6, the large cell's state): six commits
each way from one rank actor, with wall and CPU seconds per commit and the machine's shared
memory (``Shmem`` in /proc/meminfo, which holds Ray's object store too) after each; then
whether the last commit outlives the rank's process and whether closing the slabs frees
it. A probe, not part of ``make bench-tax``.
"""
import sys
import time

import ray
import torch

from raysgd.driver.slabs import CommitSlabs
from raysgd.state.packing import unpack_tensors
from raysgd.worker.slab_writer import SlabWriter

GB = float(sys.argv[1]) if len(sys.argv) > 1 else 1.6
N = int(GB * 2**30) // 4 * 4
REPS = 6


def shmem_mb():
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("Shmem:"):
                return int(line.split()[1]) // 1024
    return 0


def _timed(commit):
    wall, cpu = time.perf_counter(), time.process_time()
    out = commit()
    return out, (time.perf_counter() - wall, time.process_time() - cpu, shmem_mb())


@ray.remote
class Rank:
    def __init__(self):
        torch.manual_seed(0)
        self.state = {"w": torch.randn(N // 4)}
        self.writer = SlabWriter()

    def slab_commit(self, target):
        """One commit into the slab ``target`` names, as a runner makes it."""
        (snap, wrote), row = _timed(lambda: self.writer.write(target, self.state))
        head = float(self.state["w"][:1000].sum())  # what a reader must find
        self.state["w"].add_(1e-3)
        return snap, row, wrote, head

    def put_commits(self):
        rows, ref = [], None
        for _ in range(REPS):
            new, row = _timed(lambda: ray.put(self.state))
            ref = new  # the previous commit is dropped only once the new one exists
            self.state["w"].add_(1e-3)
            rows.append(row)
        del ref
        return rows


class _Held:
    """The commit the driver still needs (a slot ``CommitSlabs`` must not hand out)."""

    def __init__(self, version):
        self.slab_versions = (version,)


def main():
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    here = ray.get_runtime_context().get_node_id()
    base, slabs, rank = shmem_mb(), CommitSlabs(), Rank.remote()
    held, rows, in_slab = None, [], True
    for _ in range(REPS):
        (target,) = slabs.targets([here], [held], here=here)
        snap, row, wrote, head = ray.get(rank.slab_commit.remote(target))
        slabs.consumed(0, target.version)
        held, in_slab = _Held(target.version), in_slab and wrote
        rows.append(row)
    ray.kill(rank)  # the rank dies: its last commit lives on in the driver's slab
    time.sleep(1)
    restored = unpack_tensors(snap)["w"]
    print(f"state {N / 2**30:.2f} GiB; shmem before {base} MB; every commit in a slab: {in_slab}")
    print("slab commits: wall s, cpu s, shmem MB:",
          [(round(w, 3), round(c, 3), s) for w, c, s in rows])
    print("the last commit reads back after the rank's death:",
          abs(float(restored[:1000].sum()) - head) < 1e-3)
    del restored, snap
    slabs.close()
    time.sleep(1)
    print("shmem after the slabs were closed:", shmem_mb(), "MB")
    puts = ray.get(Rank.remote().put_commits.remote())
    print("ray.put: wall s, cpu s, shmem MB:", [(round(w, 3), round(c, 3), s) for w, c, s in puts])
    ray.shutdown()


if __name__ == "__main__":
    main()
