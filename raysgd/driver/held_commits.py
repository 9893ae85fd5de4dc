"""The supervisor's commits: each one held, copied off its node and, after a failure,
chosen for the restore, by :class:`raysgd.commits.protocol.CommitProtocol`. No Ray here: the
worker group copies (``copy_commit``, ``raysgd.driver.replicas``) and says which nodes went
(``gone_nodes``).

A commit whose part lives in Ray's store on a worker's node is pending until its copy to
another node landed: a restore takes it while that node lives, and passes it over for the
newest copied one when the node went first. A call's end, a state-changing call and the
group's first commit wait for their copies (``settle``), so a lost node never takes back a
state a call returned, and nothing has to be done again between calls.

:class:`HeldCommits` is mixed into :class:`raysgd.driver.supervisor.Supervisor`: it uses its
``group``, ``timeout_s``, ``stats`` and ``_watch_drains``.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from raysgd.commits.protocol import CommitProtocol, Part, Point
from raysgd.commits.rules import TODAY
from raysgd.driver.replicas import NO_COPIES, Landing, lost_objects
from raysgd.errors import CheckpointError, RankFailure, WorkerFailedError
from raysgd.state.commit import Commit

logger = logging.getLogger("raysgd")

__all__ = ["HeldCommits", "NO_COPIES"]
SAFE = "held"  # a part's place that no failure of a rank or its node reaches (the driver's)
COPY_POLL_S = 0.5  # a call's end checks this often whether its commit's copies landed
RECOVER_TRIES, RECOVER_WAIT_S = 3, 1.0  # a commit Ray reports a part of lost, read again


def _point(commit: Commit, landing: Landing) -> Point:
    """The protocol's view of ``commit``: each part safe, or on the node it awaits a copy
    from; the payload keeps the commit and its landing."""
    versions = dict(zip(commit.slab_ranks, commit.slab_versions))
    parts = tuple(Part(rank, commit.step, landing.sources.get(rank, SAFE), versions.get(rank),
                       ref) for rank, ref in enumerate(commit.snapshots))
    return Point(commit.step, parts, payload=(commit, landing))


class HeldCommits:
    """Mixed into the supervisor (see the module's docstring)."""

    def _init_commits(self, num_workers: int) -> None:
        self.commits = CommitProtocol(num_workers, SAFE, TODAY)

    def _adopt(self, commit: Commit, landing: Landing) -> None:
        """``commit`` is the one to restore now (the ranks were just loaded from it)."""
        self.commits.adopt(_point(commit, landing))

    @property
    def commit(self) -> Optional[Commit]:
        """The newest commit: the one the ranks stand at, or trained on from."""
        points = self.commits.pending or [self.commits.current]
        return None if points[-1] is None else points[-1].payload[0]

    def _hold(self, commit: Commit, settle: bool = False) -> None:
        """``commit`` is the newest; its copies start. With ``settle``, wait until they
        landed: a :class:`WorkerFailedError` names the ranks whose node went first."""
        point = _point(commit, self.group.copy_commit(commit))
        if self.commits.formed(point).current or not settle:
            return
        landing, deadline = point.payload[1], time.monotonic() + self.timeout_s
        while not landing.landed(COPY_POLL_S):
            gone = landing.sources_gone()
            if gone:
                raise WorkerFailedError(
                    f"rank(s) {sorted(gone)}: node lost before the commit of step "
                    f"{commit.step} was copied off it",
                    [RankFailure(rank, RuntimeError("node lost"), died=True) for rank in gone])
            # A stuck copy must not hang the call, nor one that cannot be made wait for it.
            if time.monotonic() > deadline or landing.failed:
                logger.warning("raysgd: the commit of step %d could not be copied off its "
                               "node(s) (in timeout_s=%gs); going on with it pending (a lost "
                               "node would take it)", commit.step, self.timeout_s)
                return
        self._copied(point)

    def _copied(self, point: Point) -> None:
        for rank in point.payload[1].sources:
            self.commits.copy_landed(rank, point.step)

    def _tick(self) -> None:
        """Every tick of a running call's watch: pending commits whose copies landed become
        the restorable ones; draining nodes are looked at."""
        self._landings()
        self._watch_drains()

    def _landings(self) -> None:
        """Pending commits whose copies landed become the restorable ones."""
        for point in list(self.commits.pending):
            if point.payload[1].landed():
                self._copied(point)

    def _restore_commit(self, group: Any, **kwargs) -> None:
        """The newest commit a lost node did not take a part of (``CommitProtocol.restore``),
        each part whose node went read from its copy. A part Ray reports lost is looked at
        again a few times (its node's death may not be known yet), then that commit is
        passed over for the next."""
        newest, tries = self.commit.step, RECOVER_TRIES
        self._landings()
        while True:
            point = self.commits.restore(self._lost_parts()).point
            if point is None:
                raise CheckpointError(
                    f"every commit up to step {newest} lost a part with a node before its copy "
                    "landed; nothing is left to restore")
            commit, landing = point.payload
            try:
                group.restore(landing.readable(commit), **kwargs)
            except Exception as exc:
                if not lost_objects(exc):
                    raise
                tries -= 1
                if not tries:
                    self.commits.unreadable(point)
                    tries = RECOVER_TRIES
                time.sleep(RECOVER_WAIT_S)
                continue
            self.commits.restored(point.step)
            break
        if point.step < newest:
            logger.warning("raysgd: the commit of step %d was lost with a node before its copy "
                           "landed; restored the commit of step %d instead", newest, point.step)
            self.stats.steps_lost += newest - point.step

    def _lost_parts(self) -> Callable[[Part], bool]:
        """Whether a part went with its node (only a pending commit's part can), as the
        nodes stand now."""
        nodes = {p.node for point in self.commits.pending for p in point.parts
                 if p.node != SAFE}
        gone = self.group.gone_nodes(nodes) if nodes else set()
        return lambda part: part.node in gone

