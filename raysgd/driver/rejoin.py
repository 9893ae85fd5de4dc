"""Dead ranks replaced while the surviving processes stay, and the spares kept for that.

The recovery half of :class:`raysgd.driver.worker_group.WorkerGroup` (which mixes this
in and owns ``actors``, ``spares``, ``residence`` and the placement). A rank whose
process died gets a newcomer: a spare whose process runs (warm, or still warming: its
start call then waits for the warm-up, which is further along than a new process
would be), else a new process started for that rank alone on the rank's bundle. The
survivors keep their processes: every rank releases its runner and sets up again with
the newcomers (process group, operators) and the caller restores the commit. A full
restart of every rank is left to the cases this cannot serve: a survivor still inside
the call (``left_running``), a dead rank in the driver (``use_local``), or a rank whose
node is gone (its bundle must be placed anew).
"""
from __future__ import annotations

import logging
from typing import Any, Collection, Dict, List, Sequence

from raysgd.driver import placement, spare_plan, warm as warm_processes

logger = logging.getLogger("raysgd")


class Rejoin:
    """Newcomers for dead ranks, and spares, for ``self.actors`` (module docstring)."""

    actors: List[Any]
    spares: List[Any]
    local_runner: Any
    left_running: bool

    def can_replace(self, ranks: Sequence[int]) -> bool:
        """Whether the dead ``ranks`` can be replaced with the others staying: the survivors
        left the call, no dead rank lived in the driver and the dead ranks' nodes live."""
        if not ranks or self.left_running or min(ranks) < self._first_remote:
            return False
        alive = placement.alive_nodes()
        return all(self._nodes[rank] in alive for rank in ranks)

    def replace(self, ranks: Sequence[int], avoid: Collection[str] = (),
                placement_timeout_s: float = 5.0) -> List[Dict[str, Any]]:
        """Newcomers take the ``ranks``' places (spares first, else new processes on the
        ranks' bundles) and every rank sets up again; the survivors keep their processes.
        ``avoid``: draining nodes the ranks leave; their newcomers get new bundles, which Ray
        places on other nodes (within ``placement_timeout_s``), and spares there are passed
        over. Returns the operators' summaries; on a failure the caller stops the group."""
        offset, ranks = self._first_remote, list(ranks)
        # A GPU spare would use the devices of a rank on another node: a move needs bundles.
        usable = [] if avoid and self.residence.keeps_group else \
            [spare for spare in self.spares if spare.node not in avoid]
        taken = warm_processes.usable_spares(usable, len(ranks))
        for spare in taken:
            self.spares.remove(spare)
        if avoid:
            self._reseat([rank - offset for rank in ranks[len(taken):]], placement_timeout_s)
        nodes = self._worker_nodes()
        fresh = [self.residence.actor(*self._seat(rank - offset), self._bundle(),
                                      nodes[rank - offset])
                 for rank in ranks[len(taken):]]
        for rank, actor in zip(ranks, [spare.actor for spare in taken] + fresh):
            warm_processes.kill(self.actors[rank - offset])
            self.actors[rank - offset] = actor
        logger.warning("raysgd: rank(s) %s taken by %d warm spare(s) and %d new process(es); "
                       "the other ranks keep their processes and the process group re-forms",
                       ranks, len(taken), len(fresh))
        self._get([a.release.remote() for a in self.actors], offset=offset)
        for rank, spare in zip(ranks, taken):
            # A spare holds no GPU: it takes the dead rank's, which the bundle still reserves
            # (after release(), which puts the environment back as it found it).
            spare.actor.use_devices.remote(self._devices[rank])
        infos = []
        if self.local_runner is not None:
            self.local_runner.shutdown()
            self.local_runner = None
            infos.append(self._local_info())
        infos += self._get([a.node_info.remote() for a in self.actors], offset=offset)
        return self._set_up(infos)

    def _reseat(self, workers: List[int], timeout_s: float) -> None:
        """New bundles for remote ``workers`` leaving a draining node (Ray places nothing
        new there); the old ones go when the node does."""
        if workers:
            group = placement.reserve(self._bundle(), len(workers), timeout_s, "PACK")
            self._moved_seats.update({worker: (group, k) for k, worker in enumerate(workers)})

    def spares_on(self, nodes: Collection[str]) -> int:
        """Stop the spares on ``nodes`` (draining ones); how many there were. The next
        commit starts new ones elsewhere."""
        leaving = [spare for spare in self.spares if spare.node in nodes]
        for spare in leaving:
            warm_processes.kill(spare.actor)
            self.spares.remove(spare)
        return len(leaving)

    def refill_spares(self, avoid: Collection[str] = ()) -> None:
        """Start spares up to the wanted count, without waiting for them.

        Called at each commit, not at start: a starting process takes CPU that the
        workers' own start and first steps need more.
        """
        for spare in [spare for spare in self.spares if spare.failed()]:
            warm_processes.kill(spare.actor)
            self.spares.remove(spare)
        if not (self.actors and self._nodes) or \
                len(self.spares) >= spare_plan.most(self.warm.spares):
            return
        key = (list(self._nodes), set(avoid))
        if self._spare_plan is None or self._spare_plan[0] != key:
            cpus = {node: n for node, n in placement.node_cpus().items() if node not in avoid}
            nodes = spare_plan.spare_nodes(self.warm.spares, self._nodes, self._reserved_cpus(),
                                           cpus)
            self._spare_plan = (key, nodes)
        missing = self._spare_plan[1][len(self.spares):]
        if missing:
            self.spares += warm_processes.start_spares(self.residence, self.operator_cls,
                                                       missing)

    def _reserved_cpus(self) -> Dict[str, float]:
        """CPUs this group's bundles reserve on each node."""
        reserved: Dict[str, float] = {}
        per_worker = float(self.settings.num_cpus_per_worker)
        for node in self._worker_nodes():
            reserved[node] = reserved.get(node, 0.0) + per_worker
        return reserved
