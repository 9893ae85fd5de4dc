"""Keeps a worker group alive across failures: commits, rollback, resize, stats.

The trainer hands every call to a :class:`Supervisor`. The last good state (a
:class:`Commit`) always matches the workers between calls: it is taken when the group
starts, returned together with every ``train()`` result, and retaken after each call that
changes state (``validate`` does not: it leaves even the RNGs alone); between-call commits
go to the driver's slabs where they can (``raysgd.driver.slabs``). Inside ``train()`` the
call's watch moves it forward every ``checkpoint_every_n_steps`` batches. On a recoverable
failure newcomers (warm spares, else new processes for those ranks alone, where Ray places a
lost node's bundles anew) take the dead ranks' places while the survivors keep theirs, when
they can (not when a survivor is stuck inside the call, or no node has room); otherwise the
supervisor tears the group down, asks the :class:`RecoveryPolicy` what to do and starts a new
group. Either way every rank restores the commit and the call resumes from its step. A node
draining for preemption has its ranks moved before it goes, at an agreed step, losing none
(``raysgd.driver.preemption``). Which commit a recovery restores is decided by
:class:`raysgd.commits.protocol.CommitProtocol`: a commit's copy to another node
(``raysgd.driver.replicas``) lands in the background, and until it has, the commit is
pending: restored while its nodes live, passed over for the newest one whose copies landed
when a lost node took a part along. A call returns, and the group's first commit counts, only
once its commit's copies landed, so a lost node never takes back a state a call returned.

An exception raised by user code is not retried: it reaches the caller with its own type,
but first every rank is rolled back to the commit, in place when all ranks left the call, or
by restarting the group when some rank is still inside it (waiting in a collective the
failed rank never joined). So the trainer stays usable and the trained state survives.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from raysgd.commits.interval import create_interval
from raysgd.config import DEFAULT_COMMIT_EVERY
from raysgd.driver.held_commits import NO_COPIES, HeldCommits
from raysgd.driver.preemption import Preemption
from raysgd.driver.progress import NULL_PROGRESS
from raysgd.driver.recovery import Decision, RecoveryPolicy
from raysgd.driver.recovery_stats import RecoveryClock, RecoveryStats
from raysgd.driver.replicas import Copiers
from raysgd.driver.slabs import HeldSlabs
from raysgd.errors import (CheckpointError, ResourcesUnavailableError, RetriesExhaustedError,
                           WorkerFailedError)
from raysgd.state.commit import Commit

logger = logging.getLogger("raysgd")


def _dead_ranks(failure: WorkerFailedError) -> List[int]:
    return sorted({f.rank for f in failure.failures if f.died})


@dataclass(frozen=True)
class TrainCall:
    """One ``train()`` call: ``num_steps`` (None: to the end of the pass) and ``info``."""

    num_steps: Optional[int]
    info: Optional[dict]

    def remaining(self, done: int) -> Tuple[Optional[int], bool]:
        """``(num_steps, resume)`` for ``train_and_commit`` when the commit holds ``done``
        steps of this call (its ``call_done``)."""
        return (None if self.num_steps is None else self.num_steps - done), done > 0


class Supervisor(Preemption, HeldCommits, HeldSlabs):
    def __init__(self, make_group: Callable[[int, bool], Any], num_workers: int,
                 policy: RecoveryPolicy, timeout_s: float, local_ranks: int = 0,
                 on_commit: Optional[Callable[[Commit, bool], None]] = None, drains=None,
                 on_driver_drain: Optional[Callable[[Commit, Optional[float]], None]] = None,
                 kept: Optional[Callable[[], List[Commit]]] = None, interval: Any = None):
        self.make_group = make_group
        # Told of every new commit (and whether it was taken inside a train() call).
        self.on_commit = on_commit or (lambda commit, in_epoch: None)
        self.target = num_workers
        self.policy = policy
        self.timeout_s, self.local_ranks = timeout_s, local_ranks  # ranks in the driver
        self.stats = RecoveryStats(num_workers=num_workers)
        # How far apart in-epoch commits are (raysgd.commits.interval): told each call's cost.
        self.interval = interval or create_interval(DEFAULT_COMMIT_EVERY)
        self._interval_moved()
        self.group, self.capabilities = None, []
        self._init_commits(num_workers)
        self.copiers = Copiers()  # who makes commits' copies off their nodes
        self._clock = RecoveryClock()  # the recovery under way: its parts' seconds
        # Ray's draining nodes (a test passes its own); the driver's own drain saves a commit.
        self._init_preemption(drains, on_driver_drain)
        self._init_slabs(kept)  # ``kept``: the commits the disk writer has yet to write

    def start(self, resume_from: Optional[Tuple[int, int, List[dict]]] = None) -> None:
        """Start the workers, at ``resume_from`` = (step, epochs done, snapshot dicts) if given.

        A resume state the workers cannot load stops them and raises
        :class:`CheckpointError` (the cause chained); failures to start raise as they are.
        """
        self.group, self.capabilities = self._launch(self.target, recovering=False)
        if resume_from is None:
            self._hold(self.group.snapshot(), settle=True)
            return
        step, epochs_done, snapshots = resume_from
        commit = Commit(step, 0, len(snapshots), [self.group.put(snap) for snap in snapshots],
                        epochs_done)
        try:
            self.group.restore(commit)
        except BaseException as exc:
            self.shutdown(force=True)
            if isinstance(exc, WorkerFailedError) or not isinstance(exc, Exception):
                raise
            first_line = (str(exc).strip().splitlines() or [""])[0]
            raise CheckpointError(f"{type(exc).__name__}: {first_line}") from exc
        self._adopt(commit, NO_COPIES)  # put from here: on the driver's node

    def _launch(self, count: int, recovering: bool):
        group = self.make_group(count, recovering)
        group.slabs, group.copiers = self._group_slabs(), self.copiers
        return group, group.start()

    # ---------------------------------------------------------------- calls
    def train(self, num_steps: Optional[int], profile: bool, info: Optional[dict],
              max_retries: Optional[int], progress: Any = NULL_PROGRESS) -> List[dict]:
        self.policy.start_call(max_retries)
        self._scale_up()
        self._hand_over_safely()
        call = TrainCall(num_steps, dict(info) if isinstance(info, dict) else info)
        headers = self._train_call(call, profile, progress)
        self._note_recovery_time(headers[0]["first_step_wall"])
        self._note_handover_time(headers[0]["first_step_wall"])
        return [header["metrics"] for header in headers]

    def _train_call(self, call: TrainCall, profile: bool, progress: Any) -> List[dict]:
        """Run ``call`` to its end across failures and moves; commit its end (held once its
        copies landed); the headers."""
        while True:
            remaining, resume = call.remaining(self.commit.call_done)
            self._stopping = False  # a stop agreed before a failure is void after it
            watch = self.group.watch(self.timeout_s, self.commit.step, on_commit=self._set_commit,
                                     on_progress=progress.update, on_tick=self._tick)
            try:
                headers, commit = self.group.execute_pair(
                    "train_and_commit", remaining, profile, call.info, resume, watch.ticket,
                    self.interval.current.steps, watch=watch)
                stopped = bool(headers[0].get("stopped"))
                # A stop's commit too: the draining node may go once the ranks moved.
                self._moved(commit, in_epoch=stopped, settle=True)
            except WorkerFailedError as failure:
                self._recover(failure, self._reached(watch))
                continue
            except BaseException as error:
                self._roll_back(error, mutated=True, steps_lost=self._steps_lost(watch),
                                read_data=True)
                raise
            if not stopped:
                self._observe(headers)
                return headers
            # Every rank stopped at the agreed step: move the draining node's ranks.
            self._hand_over_safely(stopped=True)

    def call(self, method: str, *args, mutates: bool = False, watched: bool = False,
             abort_on_failure: bool = True, rank: Optional[int] = None,
             progress: Any = NULL_PROGRESS):
        """Any other call (on ``rank`` only, if given), recovered and retried after a
        worker failure; a state-changing call is committed after it ran."""
        self.policy.start_call()
        self._hand_over_safely()
        while True:
            watch = self.group.watch(self.timeout_s, 1 << 62, on_progress=progress.update) \
                if watched else None
            try:
                if rank is not None:
                    return self.group.execute_single(rank, method, *args)
                result = self.group.execute(method, *args, abort_on_failure=abort_on_failure,
                                            watch=watch)
                if mutates:
                    self._moved(self.group.snapshot(), in_epoch=False, settle=True)
                return result
            except WorkerFailedError as failure:
                self._recover(failure)
            except BaseException as error:
                self._roll_back(error, mutated=mutates)
                raise

    def refresh_data(self) -> None:
        """The driver's datasets changed (``train(dataset=...)``): new shards on every rank,
        committed (the new input starts a new pass). After a worker failure the new
        group sets up with the new datasets anyway."""
        self.policy.start_call()
        try:
            self.group.attach_data(self.capabilities)
            self._moved(self.group.snapshot(), in_epoch=False, settle=True)
        except WorkerFailedError as failure:
            self._recover(failure)

    def _observe(self, headers: List[dict]) -> None:
        """What commits cost the ranks in the call that just ended: the next call's interval."""
        self._interval_moved(lambda: self.interval.observe(
            [h["cost"] for h in headers if h.get("cost")]))

    def _interval_moved(self, event: Callable[[], None] = lambda: None) -> None:
        """Tell the interval ``event``; the stats show the interval it now chooses."""
        event()
        self.stats.commit_interval = self.interval.current.steps

    def _set_commit(self, commit: Commit) -> None:
        self._moved(commit, in_epoch=True)

    def _moved(self, commit: Commit, in_epoch: bool, settle: bool = False) -> None:
        self._hold(commit, settle)
        self.on_commit(commit, in_epoch)
        # Training runs: time to warm spares for a failure (never on a draining node).
        self.group.refill_spares(avoid=self.drains.draining)

    # ------------------------------------------------------------- recovery
    def _recover(self, failure: WorkerFailedError, reached: Optional[int] = None) -> None:
        """``reached``: the furthest step a rank of the failed ``train()`` call reached."""
        self.stats.failures += 1
        self._clock.start(since=failure.last_seen)
        with self._clock.phase("survivors"):
            survived = self._from_survivors(failure)
        if not survived:  # from survivors one batch re-runs, whatever the interval
            self._interval_moved(self.interval.failed)
        steps_lost = 0 if reached is None else max(0, reached - self.commit.step)
        self.stats.steps_lost += steps_lost
        logger.warning("raysgd: recovering from worker failure (ranks %s), rolling back to step "
                       "%d (%d step(s) lost): %s", list(failure.ranks), self.commit.step,
                       steps_lost, failure)
        previous = self.group.num_workers
        decision = self._replace_or_stop(failure, previous)
        if decision is None:
            self.stats.recoveries += 1
            return
        ceiling = self.target  # lowered when a size could not be placed
        while True:
            if not decision.retry:
                self.group = None
                raise RetriesExhaustedError(
                    f"Giving up after worker failure: {decision.reason}.", failure.failures) from failure
            with self._clock.phase("backoff"):
                time.sleep(decision.wait_s)
            count = min(decision.num_workers, ceiling)
            reason = decision.reason if count == decision.num_workers else \
                f"resize to {count} of {self.target} worker(s): a larger group could not be placed"
            if count and self._relaunch(count, reason, previous):
                self.stats.recoveries += 1
                return
            if count:
                # The resource view can lag a lost node: try one fewer next time.
                ceiling = max(count - 1, self.policy.config.min_workers)
            decision = self.policy.on_no_capacity(self._placeable(previous))

    def _from_survivors(self, failure: WorkerFailedError) -> bool:
        """Under a replicated strategy the survivors' live state, when still at the failed
        batch's start, becomes the commit (``driver/survivors.py``): only that batch re-runs.
        Whether it did."""
        dead = _dead_ranks(failure)
        if not self.group.can_replace(dead):
            return False
        fresh = self.group.survivor_commit(dead, self.commit)
        if fresh is not None:
            self._moved(fresh, in_epoch=True)  # pending while its copy lands
        return fresh is not None

    def _replace_or_stop(self, failure: WorkerFailedError, previous: int) -> Optional[Decision]:
        """Newcomers (spares, else new processes) take the dead ranks' places while the
        survivors stay: None when they did. Otherwise the group is stopped and the policy's
        decision for starting a new one is returned."""
        dead = _dead_ranks(failure)
        if not self.group.can_replace(dead):
            self.group.shutdown(force=True)
            return self.policy.on_failure(self._placeable(previous))
        decision = self.policy.on_failure(previous)  # the dead ranks' bundles are still ours
        if decision.retry:
            with self._clock.phase("backoff"):
                time.sleep(decision.wait_s)
            if self._replaced(dead):
                return None
        self.group.shutdown(force=True)
        # Still the same recovery attempt: start a new group at once.
        return self.policy.restart_now(self._placeable(previous)) if decision.retry else decision

    def _replaced(self, dead: List[int]) -> bool:
        """Newcomers take the ``dead`` ranks' places, the survivors stay; every rank loads
        the commit. False (the group is then stopped) when that fails."""
        try:
            with self._clock.phase("replace"):
                capabilities = self.group.replace(dead, avoid=self.drains.draining)
            self._restore(self.group)
        except Exception as exc:  # noqa: BLE001 - a half re-formed group must not train on:
            # the full restart below sets every rank up anew (and raises a user error again)
            logger.warning("raysgd: rank(s) %s could not be replaced with the other ranks "
                           "staying (%r); restarting every worker", dead, exc)
            return False
        self.capabilities = capabilities
        # Spares for the next failure start now, not at the next commit: failures can come
        # seconds apart, and a warm-up takes seconds.
        self.group.refill_spares(avoid=self.drains.draining)
        return True

    def _roll_back(self, error: BaseException, mutated: bool, steps_lost: int = 0,
                   read_data: bool = False) -> None:
        """User code raised: put every rank back at the last commit, or close the trainer."""
        self.stats.user_errors += 1
        self.stats.steps_lost += steps_lost
        # A Ctrl-C on the driver leaves the call running on the workers.
        stuck = self.group.left_running or not isinstance(error, Exception)
        if not stuck and not mutated:
            return  # every rank left a call that changes no state: nothing to undo
        logger.warning("raysgd: %s in user code; rolling every rank back to the commit of step "
                       "%d (%s)", type(error).__name__, self.commit.step,
                       "restarting the workers: a rank was still inside the call" if stuck
                       else "in place")
        try:
            if stuck or not self._restored_in_place(read_data):
                self._restart_at_commit()
        except BaseException as exc:  # noqa: BLE001 - the user's error is the one to raise
            logger.error("raysgd: could not roll back after %s (%r); the workers are stopped",
                         type(error).__name__, exc)
            self.shutdown(force=True)

    def _restored_in_place(self, read_data: bool) -> bool:
        try:
            self._restore(self.group, renew_shards=read_data)
            return True
        except WorkerFailedError as exc:
            logger.warning("raysgd: in-place rollback failed (%s); restarting", exc)
            return False

    def _restart_at_commit(self) -> None:
        count = self.group.num_workers
        self.group.shutdown(force=True)
        if not self._relaunch(count, "rollback after a user error", count):
            raise ResourcesUnavailableError(f"could not restart {count} worker(s)")

    def _relaunch(self, count: int, reason: str, previous: int) -> bool:
        try:
            with self._clock.phase("restart"):
                group, capabilities = self._launch(count, recovering=True)
        except (ResourcesUnavailableError, WorkerFailedError) as exc:
            logger.warning("raysgd: restart with %d worker(s) failed: %s", count, exc)
            return False
        try:
            self._restore(group)
        except WorkerFailedError as exc:
            group.shutdown(force=True)
            logger.warning("raysgd: restore on %d worker(s) failed: %s", count, exc)
            return False
        except BaseException:
            group.shutdown(force=True)
            raise
        if count != previous:
            self.stats.resizes.append((previous, count, reason))
            self.policy.resized()
            logger.warning("raysgd: resized from %d to %d worker(s): %s", previous, count, reason)
        self.group, self.capabilities = group, capabilities
        self.stats.num_workers = count
        return True

    def _restore(self, group: Any, **kwargs) -> None:
        """``group.restore(self.commit)``; when a lost node took part of that commit along
        before its copy landed, the commit before it (the fallback) instead."""
        with self._clock.phase("restore"):
            self._restore_commit(group, **kwargs)

    def _placeable(self, want: int) -> int:
        return self.local_ranks + self.group.placeable_workers(want=want - self.local_ranks)

    def _reached(self, watch: Any) -> int:
        reports = watch.monitor.reports.values()
        return max((r.get("steps", 0) for r in reports), default=self.commit.step)

    def _steps_lost(self, watch: Any) -> int:
        return max(0, self._reached(watch) - self.commit.step)

    def _note_recovery_time(self, first_step_wall: Optional[float]) -> None:
        parts = self._clock.finish(first_step_wall)
        if parts is not None:
            self.stats.recovery_times_s.append(parts["total_s"])
            self.stats.recovery_phases.append(parts)

    def _scale_up(self) -> None:
        """At the start of a call, grow back towards ``num_workers`` when resources returned."""
        current = self.group.num_workers
        if current >= self.target:
            return
        count = self.policy.scale_up_target(current, self.group.placeable_workers())
        if count <= current:
            return
        self.group.shutdown()
        if not self._relaunch(count, "resources returned", current) and \
                not self._relaunch(current, "scale-up failed", current):
            raise ResourcesUnavailableError(f"Could not restart {current} worker(s) after a "
                                            "failed scale-up; see the log for the cause.")

    def shutdown(self, force: bool = False) -> None:
        if self.group is not None:
            self.group.shutdown(force=force)
            self.group = None
        self.copiers.close()  # the commits copies are made of go now too
        self._init_commits(self.target)
