"""What each kind of event does to a trainer: processes (torchrun) or a Ray cluster.

Both targets answer ``kill(rank)`` and ``lose_node(rank)`` with a short outcome string
("ok ..." when the event landed, anything else when it missed: the rank's process was
already gone, say), and ``preempt(rank, notice_s)`` with that and what to do when the
notice runs out (the injector calls it then). They find a rank's process and node in the rank
files of :mod:`bench.chaos.ranklog`.
"""
from __future__ import annotations

import os
import signal
from typing import Callable, Optional, Tuple

from bench.chaos.ranklog import read_rank
from bench.recovery.drain import drain
from bench.procmem import start_ticks

NODE_CPUS = 2
NUM_NODES = 3


def _signal(pid: int, sig: int) -> str:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return f"missed: pid {pid} already gone"
    return f"ok: {signal.Signals(sig).name} to pid {pid}"


def _killer(pid: int) -> Callable[[], None]:
    """SIGKILL for ``pid`` later, unless it exited (or its pid was reused) by then."""
    born = start_ticks(pid)

    def _kill() -> None:
        if born is not None and start_ticks(pid) == born:
            _signal(pid, signal.SIGKILL)

    return _kill


class ProcessTargets:
    """torchrun's workers, one rank per simulated node: losing a node is SIGKILL of its rank's
    process, a preemption is SIGTERM now and SIGKILL when the notice runs out."""

    def __init__(self, step_dir: str):
        self.step_dir = step_dir

    def forget(self) -> None:
        """Nothing to forget: no cluster."""

    def _pid(self, rank: int) -> Optional[int]:
        found = read_rank(self.step_dir, rank)
        return found[0] if found else None

    def kill(self, rank: int) -> str:
        pid = self._pid(rank)
        return _signal(pid, signal.SIGKILL) if pid else "missed: no process yet"

    lose_node = kill

    def preempt(self, rank: int, notice_s: float) -> Tuple[str, Optional[Callable]]:
        pid = self._pid(rank)
        if not pid:
            return "missed: no process yet", None
        outcome = _signal(pid, signal.SIGTERM)
        return outcome, _killer(pid) if outcome.startswith("ok") else None


class RayTargets(ProcessTargets):
    """A ``ray.cluster_utils.Cluster`` of a CPU-less head (the driver's) and ``NUM_NODES``
    nodes of ``NODE_CPUS``; a kill is as for processes. A lost or preempted node is replaced
    by a fresh one as soon as it is gone, as an autoscaler or a spot pool would (here at
    once: the figure is the trainer's, not the cloud's)."""

    def __init__(self, step_dir: str):
        from ray.cluster_utils import Cluster

        super().__init__(step_dir)
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(NUM_NODES):
            self.cluster.add_node(num_cpus=NODE_CPUS)
        self._gcs_client = None

    def _gcs(self):
        """A GCS client of this process's own: it drives no trainer (``bench.chaos.driver``)."""
        if self._gcs_client is None:
            from ray._raylet import GcsClient

            self._gcs_client = GcsClient(address=self.cluster.address)
        return self._gcs_client

    def _node(self, rank: int):
        found = read_rank(self.step_dir, rank)
        if not found:
            return None
        return next((node for node in self.cluster.worker_nodes
                     if node.node_id == found[1]), None)

    def _replace(self, node) -> bool:
        if node not in self.cluster.worker_nodes:
            return False  # gone already (lost while it was draining, say)
        self.cluster.remove_node(node, allow_graceful=False)
        self.cluster.add_node(num_cpus=NODE_CPUS, wait=False)
        return True

    def lose_node(self, rank: int) -> str:
        node = self._node(rank)
        if node is None:
            return "missed: the rank's node is gone already"
        return f"ok: node {node.node_id[:8]} lost" if self._replace(node) else "missed: node gone"

    def preempt(self, rank: int, notice_s: float) -> Tuple[str, Optional[Callable]]:
        node = self._node(rank)
        if node is None:
            return "missed: the rank's node is gone already", None
        why = drain(node.node_id, notice_s, "bench.chaos: spot preemption", self._gcs())
        if why is not None:
            return f"missed: drain refused ({why})", None
        return (f"ok: node {node.node_id[:8]} drained, gone in {notice_s:.0f}s",
                lambda: self._replace(node))

    def forget(self) -> None:
        """Once its processes are killed: drop the address file the cluster wrote
        (``/tmp/ray/ray_current_cluster``), or a later ``ray.init()`` on this machine would try
        to join the dead cluster."""
        from ray._private.utils import get_ray_address_file, read_ray_address

        if read_ray_address() == self.cluster.address:
            os.remove(get_ray_address_file(None))

