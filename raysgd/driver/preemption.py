"""Preemption notices: ranks leave a draining node before it goes, and lose no step.

Spot and preemptible nodes are drained with a deadline before they die (Ray's drain
API, as KubeRay and the autoscaler call it). The supervisor (which mixes in
:class:`Preemption`) watches Ray's draining nodes at least once a second while a
``train()`` call runs (every tick of the call's watch) and before every call. When a
node that holds ranks drains:

1. inside ``train()``: every rank stops at one agreed step boundary
   (:meth:`raysgd.driver.stopping.Stopping.agree_stop`) and the call returns that step's
   commit, so nothing past it was trained;
2. the node's ranks get newcomers on other nodes (spares first, else new processes in
   bundles Ray places off the draining node), the survivors stay, every rank restores
   the commit and the call resumes from it. The old processes go with the node.

This is not a failure: no retry is spent, it is logged with the node and its deadline,
and counted in ``recovery_stats.preemptions``. When no other node has room for the
ranks in time, they train on where they are from the commit just taken (the node is not
acted on again): when it goes, that is a lost node, recovered from the newest commit
(at most one commit interval lost) and the group shrinks if it must. When the move
fails half-way, every rank restarts off the draining nodes at the commit, fewer if need
be. Spares on a draining node are stopped and started elsewhere.

When the driver's own node drains, nothing can move the driver: the ranks stop at one
step boundary in the same way, and ``on_driver_drain(commit)`` (the trainer's) writes
that commit to ``checkpoint_dir`` at once, before training goes on. Started again on a
new cluster, the same script resumes from it.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Dict, List, Optional

from raysgd.driver import placement
from raysgd.errors import ResourcesUnavailableError, WorkerFailedError, first_line

logger = logging.getLogger("raysgd")

POLL_EVERY_S = 1.0  # how often a running call asks Ray for draining nodes
# Of the time left before the deadline, how much placing the newcomers may take.
PLACE_SHARE = 0.5


class DrainWatch:
    """Ray's draining nodes, asked at most every ``every_s`` (``check(force=True)``: now)."""

    def __init__(self, poll: Callable[[], Dict[str, int]] = placement.draining_nodes,
                 every_s: float = POLL_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self.poll, self.every_s, self.clock = poll, every_s, clock
        self.draining: Dict[str, int] = {}
        self._next = 0.0

    def check(self, force: bool = False) -> Dict[str, int]:
        now = self.clock()
        if force or now >= self._next:
            self._next = now + self.every_s
            self.draining = self.poll()
        return self.draining


def ranks_on(nodes: List[str], draining: Dict[str, int], first_remote: int = 0) -> List[int]:
    """The ranks (``nodes``: each rank's node) on draining nodes, but a rank living in the
    driver (``first_remote``), which cannot move."""
    return [rank for rank, node in enumerate(nodes) if node in draining and rank >= first_remote]


def seconds_left(deadline_ms: int, now: Optional[float] = None) -> Optional[float]:
    """Seconds until a drain deadline (None: no deadline)."""
    if not deadline_ms:
        return None
    return deadline_ms / 1000.0 - (time.time() if now is None else now)


class Preemption:
    """The supervisor's part (module docstring). Needs ``self.group``, ``self.stats``,
    ``self.commit``, ``self.policy``, ``self._restore``, ``self._relaunch`` and
    ``self._recover``."""

    def _init_preemption(self, drains: Optional[DrainWatch] = None,
                         on_driver_drain: Optional[Callable] = None) -> None:
        self.drains = drains or DrainWatch()
        self.on_driver_drain = on_driver_drain or (lambda commit, seconds_left: None)
        self._driver_node = placement.driver_node()
        self._driver_saved: set = set()  # the driver's drains whose checkpoint was written
        self._stopping = False  # a stop was agreed in the running call
        self._next_try = 0.0  # no new agreement before this (monotonic) after one failed
        self._declined: set = set()  # draining nodes whose ranks found no room elsewhere
        self._noticed_at: Optional[float] = None  # wall time of the notice being handled

    def _moving_ranks(self, force: bool = False) -> List[int]:
        draining = self.drains.check(force)
        self._declined &= set(draining)  # a drain that ended and comes again is new
        self._driver_saved &= set(draining)
        acting = {node: deadline for node, deadline in draining.items()
                  if node not in self._declined}
        if not acting or self._driver_node in draining:
            return []  # (the ranks go with the driver, wherever they are: nothing to move)
        return ranks_on(self.group.rank_nodes, acting, 1 if self.local_ranks else 0)

    def _driver_draining(self) -> bool:
        """The driver's node drains, and its checkpoint was not written yet."""
        return self._driver_node in self.drains.draining and \
            self._driver_node not in self._driver_saved

    def _watch_drains(self) -> None:
        """Every tick of a running ``train()``: a draining node holds ranks, or is the
        driver's → stop there."""
        if self._stopping or time.monotonic() < self._next_try or \
                not (self._moving_ranks() or self._driver_draining()):
            return
        noticed = self._noticed_at or time.time()
        step = self.group.agree_stop()
        if step is None:  # the call is ending (or a rank failing): before the next call
            self._next_try = time.monotonic() + self.drains.every_s
            return
        self._stopping, self._noticed_at = True, noticed
        logger.warning("raysgd: stopping train() at step %d to %s draining node(s) %s", step,
                       "checkpoint before the driver's" if self._driver_draining() else
                       "move the ranks off", self._describe())

    def _hand_over_safely(self, stopped: bool = False) -> None:
        """:meth:`_hand_over_if_draining`; a worker failure meanwhile (the node went before
        its deadline, a newcomer died) is recovered like any other."""
        try:
            self._hand_over_if_draining(stopped)
        except WorkerFailedError as failure:
            self._noticed_at = None
            self._recover(failure)

    def _hand_over_if_draining(self, stopped: bool = False) -> None:
        """Before a call (the commit is current) and after a ``train()`` that ``stopped`` at
        an agreed step (its commit is current): move the ranks on draining nodes, stop the
        spares there. Ranks that stopped restore the commit either way, so the call's
        resumption starts from it."""
        self._stopping = False
        moving = self._moving_ranks(force=True)
        if self._driver_draining():
            self._save_for_driver_drain()
        if self.drains.draining and self.group.spares_on(self.drains.draining):
            logger.info("raysgd: stopped the spare(s) on draining node(s) %s", self._describe())
        if moving and not self.group.movable(moving):
            self._decline(moving, "the ranks cannot move while the others stay (a Tune "
                          "trial's reservation, or reuse_workers=False)")
            moving = []
        if not moving:
            self._noticed_at = None  # no hand-over to time
            if stopped:  # nothing to move (the drain ended, or only the driver's node
                self._restore(self.group)  # drains): resume in place
            return
        noticed = self._noticed_at or time.time()
        logger.warning("raysgd: node(s) %s drain for preemption; moving rank(s) %s of %d at "
                       "the commit of step %d", self._describe(), moving,
                       self.group.num_workers, self.commit.step)
        try:
            self.capabilities = self.group.replace(moving, set(self.drains.draining),
                                                   self._placement_time())
            self._restore(self.group)
        except ResourcesUnavailableError as exc:  # no bundle placed: the group is as it was
            self._decline(moving, str(exc))
            if stopped:
                self._restore(self.group)
            return
        except Exception as exc:  # noqa: BLE001 - the fallback below restarts every rank
            logger.warning("raysgd: could not move rank(s) %s (%r); restarting the workers "
                           "off the draining node(s) at the commit of step %d", moving, exc,
                           self.commit.step)
            self._restart_off_draining()
        self.stats.preemptions += 1
        self._noticed_at = noticed  # the next completed step closes the hand-over's time

    def _save_for_driver_drain(self) -> None:
        """The driver goes with its node: the commit (current here) to storage, now."""
        self._driver_saved.add(self._driver_node)
        left = seconds_left(self.drains.draining[self._driver_node])
        logger.warning("raysgd: the driver's node %s drains for preemption; writing the "
                       "commit of step %d to checkpoint_dir now", self._describe(),
                       self.commit.step)
        try:
            self.on_driver_drain(self.commit, left)
        except Exception as exc:  # noqa: BLE001 - a best effort: training goes on
            logger.warning("raysgd: the checkpoint for the driver's drain failed (%s: %s)",
                           type(exc).__name__, first_line(exc))

    def _decline(self, moving: List[int], why: str) -> None:
        """The ranks train on where they are, from the commit just taken; the node is not
        acted on again while it drains (when it goes, that is a lost node)."""
        self._declined.update(self.drains.draining)
        self._noticed_at = None
        logger.warning("raysgd: rank(s) %s stay on draining node(s) %s: %s; they train on "
                       "there from the commit of step %d until the node goes", moving,
                       self._describe(), why, self.commit.step)

    def _restart_off_draining(self) -> None:
        """Every rank anew on the nodes that are not draining, at the commit; fewer when
        fewer fit, down to ``min_workers`` (as after a lost node)."""
        previous = self.group.num_workers
        self.group.shutdown(force=True)
        for count in range(previous, self.policy.config.min_workers - 1, -1):
            if count and self._relaunch(count, "moved off draining node(s)", previous):
                return
        self.group = None
        raise ResourcesUnavailableError("No room for the workers off the draining node(s); "
                                        "add nodes or lower min_workers.")

    def _placement_time(self) -> float:
        left = [seconds_left(deadline) for deadline in self.drains.draining.values()]
        left = [s for s in left if s is not None]
        return max(1.0, min(left) * PLACE_SHARE) if left else 30.0

    def _describe(self) -> str:
        parts = []
        for node, deadline in self.drains.draining.items():
            left = seconds_left(deadline)
            parts.append(node[:12] + (f" (deadline in {left:.0f}s)" if left is not None else
                                      " (no deadline)"))
        return ", ".join(parts)

    def _note_handover_time(self, first_step_wall: Optional[float]) -> None:
        """After a completed ``train()``: notice → its first step, when a hand-over ran."""
        if self._noticed_at is None:
            return
        self.stats.handover_times_s.append((first_step_wall or time.time()) - self._noticed_at)
        self._noticed_at = None
