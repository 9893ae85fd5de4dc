"""Dead ranks replaced while the surviving processes stay, and the spares kept for that.

The recovery half of :class:`raysgd.driver.worker_group.WorkerGroup` (which mixes this
in and owns ``actors``, ``spares``, ``residence`` and the placement). A rank whose
process died gets a newcomer: a spare whose process runs (warm, or still warming: its
start call then waits for the warm-up, which is further along than a new process
would be), else a new process started for that rank alone on the rank's bundle. The
survivors keep their processes: every rank releases its runner and sets up again with
the newcomers (process group, operators) and the caller restores the commit. A rank
lost with its node gets its newcomer where Ray places its bundle anew; a rank leaving a
draining node, in a new bundle off it. A full restart of every rank is left to the
cases this cannot serve: a survivor still inside the call (``left_running``), a dead
rank in the driver (``use_local``), or no room for a lost node's bundles (the group
then shrinks).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Collection, Dict, List, Sequence

from raysgd.driver import placement, spare_plan, warm as warm_processes
from raysgd.errors import ResourcesUnavailableError

logger = logging.getLogger("raysgd")

# How long a rank lost with its node waits for Ray to place its bundle anew (it does so at
# once where a node has room); then the group restarts smaller, as before.
LOST_SEAT_WAIT_S = 2.0


class Rejoin:
    """Newcomers for dead ranks, and spares, for ``self.actors`` (module docstring)."""

    actors: List[Any]
    spares: List[Any]
    local_runner: Any
    left_running: bool

    gone_nodes = staticmethod(placement.gone_nodes)  # which of some nodes died

    def can_replace(self, ranks: Sequence[int]) -> bool:
        """Whether the dead ``ranks`` can be replaced with the others staying: the survivors
        left the call, no dead rank lived in the driver, and processes may be reused at all
        (``reuse_workers=False``, as function trainables set it: their function runs in a
        thread no one can stop, so a survivor would keep the old one)."""
        return bool(ranks) and not self.left_running and min(ranks) >= self._first_remote \
            and self.warm.reuse

    def movable(self, ranks: Sequence[int]) -> bool:
        """Whether ``ranks`` may leave a draining node with the others staying: as for dead
        ranks, and the group placed its own bundles (a new one outside a Tune trial's
        reservation would hold resources Tune does not count)."""
        return self.can_replace(ranks) and self.reservation is None

    def replace(self, ranks: Sequence[int], avoid: Collection[str] = (),
                placement_timeout_s: float = 5.0) -> List[Dict[str, Any]]:
        """Newcomers take the ``ranks``' places and every rank sets up again; the survivors
        keep their processes. A newcomer is a spare (not on a node in ``avoid`` or a dead
        one), else a new process in the rank's bundle: where it was; where Ray placed it
        anew after its node died (within ``LOST_SEAT_WAIT_S``); or, for a bundle on a
        draining node in ``avoid``, a new one Ray places elsewhere (within
        ``placement_timeout_s``). Returns the operators' summaries; raises when a bundle
        finds no room (the caller then stops the group)."""
        offset, ranks = self._first_remote, list(ranks)
        # A node that died a moment ago is still listed alive (Ray marks it dead once its
        # health checks fail, seconds later) and would be given the newcomers, which never
        # start there: its bundles are placed anew elsewhere, as for a draining node.
        avoid = set(avoid) | placement.unreachable_nodes({self._nodes[rank] for rank in ranks})
        alive = placement.alive_nodes() - avoid
        # Spares that went with their node, or would leave with it, never come back.
        self.spares_on({spare.node_now() for spare in self.spares} - alive)
        assigned = self._assign_spares(ranks, alive)
        workers = [rank - offset for rank in ranks if rank not in assigned]
        newcomers = {rank: spare.actor for rank, spare in assigned.items()}
        try:
            bundle_nodes = self._worker_nodes()
            self._reseat([w for w in workers if bundle_nodes[w] in avoid], placement_timeout_s)
            self._await_seats([w for w in workers if bundle_nodes[w] not in alive | set(avoid)])
            nodes = self._worker_nodes()
            for w in workers:
                newcomers[w + offset] = self.residence.actor(*self._seat(w), self._bundle(),
                                                             nodes[w])
        except BaseException:
            for actor in newcomers.values():  # neither a rank nor a spare: stop them
                warm_processes.kill(actor)
            raise
        finally:
            for spare in assigned.values():
                self.spares.remove(spare)
        for rank in ranks:
            warm_processes.kill(self.actors[rank - offset])
            self.actors[rank - offset] = newcomers[rank]
        logger.warning("raysgd: rank(s) %s taken by %d warm spare(s) and %d new process(es); "
                       "the other ranks keep their processes and the process group re-forms",
                       ranks, len(assigned), len(workers))
        self._get([a.release.remote() for a in self.actors], offset=offset)
        for rank, spare in assigned.items():
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

    def _assign_spares(self, ranks: List[int], alive: set) -> Dict[int, Any]:
        """``{rank: spare}`` for the ranks spares can take (spares on live nodes that are not
        draining). A GPU spare uses the dead rank's device, so it takes only a rank of its
        own node."""
        usable = [spare for spare in self.spares if spare.node_now() in alive]
        if not self.residence.keeps_group:
            return dict(zip(ranks, warm_processes.usable_spares(usable, len(ranks))))
        assigned: Dict[int, Any] = {}
        for rank in ranks:
            here = [spare for spare in usable if spare.node == self._nodes[rank]
                    and spare not in assigned.values()]
            assigned.update(zip([rank], warm_processes.usable_spares(here, 1)))
        return assigned

    def _await_seats(self, workers: List[int]) -> None:
        """Wait until Ray placed the bundles of ``workers`` anew after their node died (at
        once where a node has room); ResourcesUnavailableError when none does in time."""
        if not workers:
            return
        deadline = time.monotonic() + LOST_SEAT_WAIT_S
        while True:
            alive, nodes = placement.alive_nodes(), self._worker_nodes()
            if all(nodes[w] in alive for w in workers):
                return
            if time.monotonic() >= deadline:
                raise ResourcesUnavailableError(
                    f"no node has room for the bundle(s) of rank(s) {workers} after their node "
                    f"was lost (waited {LOST_SEAT_WAIT_S:.0f}s)")
            time.sleep(0.05)

    def _reseat(self, workers: List[int], timeout_s: float) -> None:
        """New bundles for remote ``workers`` leaving a draining node (Ray places nothing
        new there); the old ones go when the node does."""
        if not workers:
            return
        group = placement.reserve(self._bundle(), len(workers), timeout_s, "PACK")
        old = {id(g): g for g, _ in (self._moved_seats.get(w, (None, 0)) for w in workers) if g}
        self._moved_seats.update({worker: (group, k) for k, worker in enumerate(workers)})
        kept = {id(g) for g, _ in self._moved_seats.values()}
        for key, left in old.items():  # a group none of whose workers sit in it any more
            if key not in kept:
                placement.release(left)

    def spares_on(self, nodes: Collection[str]) -> int:
        """Stop the spares on ``nodes`` (draining or lost ones); how many there were. The
        next refill (at a commit, or when a replace ends) starts new ones elsewhere."""
        leaving = [spare for spare in self.spares if spare.node_now() in nodes]
        for spare in leaving:
            warm_processes.kill(spare.actor)
            self.spares.remove(spare)
        return len(leaving)

    def refill_spares(self, avoid: Collection[str] = ()) -> None:
        """Start spares up to the wanted count, without waiting for them.

        Called at each commit and after a replace, not at start: a starting process takes
        CPU that a new group's own start and first steps need more.
        """
        for spare in [spare for spare in self.spares if spare.failed()]:
            warm_processes.kill(spare.actor)
            self.spares.remove(spare)
        if not (self.actors and self._nodes) or self.warm.spares == 0:
            return
        key = (list(self._nodes), set(avoid))
        if self._spare_plan is None or self._spare_plan[0] != key:
            cpus = {node: n for node, n in placement.node_cpus().items() if node not in avoid}
            nodes = spare_plan.spare_nodes(self.warm.spares, self._nodes, self._reserved_cpus(),
                                           cpus, anywhere=not self.residence.keeps_group)
            self._spare_plan = (key, nodes)
        missing = self._spare_plan[1][len(self.spares):]
        if missing:
            self.spares += warm_processes.start_spares(self.residence, self.operator_cls,
                                                       missing)

    def _reserved_cpus(self) -> Dict[str, float]:
        """CPUs this group's bundles reserve on each node."""
        per_worker = float(self.settings.num_cpus_per_worker)
        # A rank 0 in the driver (use_local) reserves nothing but trains on its node's CPUs.
        nodes = self._worker_nodes() + self._nodes[:self._first_remote]
        reserved: Dict[str, float] = {}
        for node in nodes:
            reserved[node] = reserved.get(node, 0.0) + per_worker
        return reserved
