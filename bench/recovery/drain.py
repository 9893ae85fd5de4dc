"""A preemption notice on a fake 3-node cluster, for the preemption variants.

Every variant starts :func:`start_cluster`: a head without CPUs (the driver's) and two
nodes of 2 CPUs, all raylets on this machine (they share its cores). :class:`Drainer`
waits until the step log shows the notice step, drains the node that holds rank 0
through Ray's GCS (reason preemption, a deadline of ``deadline_s``: the call
``ray drain-node`` makes, as KubeRay and the autoscaler do) and removes the node at its
deadline, as the cloud would. :func:`analyse_notice` reads the step log: time from the
notice to the first step of a rank-0 process on another node, and steps re-run.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict, List, NamedTuple, Optional

from bench.recovery.steplog import Record, read_log, read_node

NODE_CPUS = 2
DEADLINE_S = 15
QUICK_DEADLINE_S = 10
# The quick mode's shortest step (s) after the notice, on every rank of both frameworks: its
# 176 steps after the notice then last 17.6 s or more, past the 10 s deadline however quiet the machine.
# Without it Ray Train finished them in under 10 s alone (the node went after training
# ended, so no move was measured); the suite's load had hidden that.
QUICK_MIN_STEP_S = 0.1


class PreemptPlan(NamedTuple):
    epochs: int
    deadline_s: float
    min_step_s: float  # a floor on each step's time (StepLog.completed), 0 for none


def preempt_plan(mode: str) -> PreemptPlan:
    """Training must outlast the deadline, so that the node goes while it trains. The quick
    mode (the suite's smoke run) shortens both and floors the step time; its notice still
    leaves the move time on a machine loaded by the suite (4 s did not)."""
    if mode == "quick":
        return PreemptPlan(4, QUICK_DEADLINE_S, QUICK_MIN_STEP_S)
    return PreemptPlan(14, DEADLINE_S, 0.0)


def start_cluster():
    """A head without CPUs and two 2-CPU nodes; ``ray.init`` joins it. Returns the cluster."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=NODE_CPUS)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster


def drain(node_id: str, deadline_s: float, message: str, gcs: Any = None) -> Optional[str]:
    """Drain ``node_id`` for preemption with a deadline ``deadline_s`` from now, through Ray's
    GCS (the call ``ray drain-node`` makes, as KubeRay and the autoscaler do); None when Ray
    accepted it, else why not. ``gcs``: a ``ray._raylet.GcsClient`` (default: this
    process's, which must have joined the cluster)."""
    import ray
    from ray.core.generated import autoscaler_pb2

    if gcs is None:
        gcs = ray._private.worker.global_worker.gcs_client
    accepted, why = gcs.drain_node(
        node_id, autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"), message,
        int((time.time() + deadline_s) * 1000))
    return None if accepted else str(why)


class Drainer(threading.Thread):
    """Drains rank 0's node at ``notice_step`` and removes it at the deadline."""

    def __init__(self, cluster: Any, step_dir: str, notice_step: int,
                 deadline_s: float = DEADLINE_S, timeout_s: float = 600.0):
        super().__init__(daemon=True, name="bench-drainer")
        self.cluster, self.step_dir, self.notice_step = cluster, step_dir, notice_step
        self.deadline_s, self.timeout_s = deadline_s, timeout_s
        self.notice_time: Optional[float] = None
        self.step_at_notice: Optional[int] = None
        self.removed_time: Optional[float] = None
        self.node: Optional[str] = None
        self.error: Optional[str] = None

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # noqa: BLE001 - reported in the figures
            self.error = repr(exc)

    def _run(self) -> None:
        give_up = time.monotonic() + self.timeout_s
        while not (read_log(self.step_dir) and read_log(self.step_dir)[-1][0] >= self.notice_step):
            if time.monotonic() > give_up:
                self.error = f"step {self.notice_step} not reached"
                return
            time.sleep(0.005)
        self.node = read_node(self.step_dir, 0)
        target = next(n for n in self.cluster.list_all_nodes() if n.node_id == self.node)
        self.step_at_notice = read_log(self.step_dir)[-1][0]
        deadline = time.time() + self.deadline_s
        why = drain(self.node, self.deadline_s, "bench: spot preemption")
        self.notice_time = time.time()
        if why is not None:
            self.error = f"drain refused: {why}"
            return
        time.sleep(max(0.0, deadline - time.time()))
        self.cluster.remove_node(target)
        self.removed_time = time.time()


def notice_figures(drainer: Drainer, records: List[Record], t0: float, plan: Dict[str, int]
                   ) -> Dict[str, Any]:
    """A preemption run's figures: the notice, the step log's reading of it and ``plan``
    (``notice_step``, ``expected_final_step``, ``deadline_s``)."""
    figures = {**plan, "noticed_at_step": drainer.step_at_notice,
               "kill_error": drainer.error,
               "first_step_s": records[0][1] - t0 if records else None,
               "final_step": records[-1][0] if records else None,
               "restarts": len({pid for _, _, pid in records}) - 1}
    if drainer.notice_time is not None:
        figures.update(analyse_notice(records, drainer.notice_time))
    if not figures["kill_error"] and figures.get("notice_to_step_s") is None and (
            drainer.removed_time is None or not records or records[-1][1] < drainer.removed_time):
        # Nothing moved, and the node went (if at all) after the last step: nothing measured.
        figures["kill_error"] = "training ended before the node was removed at its deadline"
    return figures


def analyse_notice(records: List[Record], notice_time: float) -> Dict[str, Optional[float]]:
    """Notice → the first step of another rank-0 process (the ranks moved or restarted),
    and the steps trained before that but re-run after it."""
    before = [r for r in records if r[1] <= notice_time]
    old_pid = before[-1][2] if before else None
    reached = before[-1][0] if before else 0
    for step, wall, pid in records[len(before):]:
        if pid != old_pid:
            return {"notice_to_step_s": wall - notice_time, "resumed_from_step": step - 1,
                    "last_step_before_move": reached, "steps_rerun": reached - (step - 1)}
        reached = step
    return {"notice_to_step_s": None, "resumed_from_step": None,
            "last_step_before_move": reached, "steps_rerun": None}
