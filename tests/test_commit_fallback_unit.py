"""The supervisor's fallback commit (``raysgd.driver.supervisor``) with a fake worker group:
no Ray. A node lost before the newest commit's copy landed on another node takes that
commit along; the recovery then restores the commit before it instead of failing, and
when the lost one was taken between calls, does again what made it
(``raysgd.driver.catch_up``) before the next call trains."""
import random

import pytest
from ray.exceptions import ObjectReconstructionFailedError

from raysgd.driver.recovery import RecoveryPolicy
from raysgd.driver.supervisor import Supervisor
from raysgd.errors import RankFailure, WorkerFailedError
from raysgd.recovery import FailureConfig
from raysgd.state.commit import Commit


def commit(step, call_done=None):
    """A commit inside a call (``call_done`` steps of it; the first call's by default) or,
    with ``call_done=0``, one between calls."""
    return Commit(step, step if call_done is None else call_done, 2,
                  [f"rank0@{step}", f"rank1@{step}"])


def lost(step):
    return ObjectReconstructionFailedError("ab" * 14, reason_message=f"part of step {step} lost")


class FakeWatch:
    ticket = 1

    class monitor:
        reports = {}

    def __init__(self, on_commit):
        self.on_commit = on_commit


class FakeGroup:
    """Two ranks. ``script``: what each ``train_and_commit`` call does, in turn: a list of
    commits to make inside the call (a step, or a ``(step, call_done)`` pair), then
    ``"die"`` (a worker dies) or the step it ends at. ``world.calls`` records every call
    made on any group: ``("train", num_steps, info, resume)`` or ``(method, *args)``."""

    def __init__(self, world, cross_nodes):
        self.world, self.copies_cross_nodes = world, cross_nodes
        self.num_workers, self.left_running, self.restored = 2, False, []
        self._watch = None

    def start(self):
        return [{}, {}]

    def snapshot(self):
        made = commit(self.world.step, call_done=0)
        # After a state-changing call: parts named after it (``world.lost`` may name them).
        return Commit(made.step, 0, 2, [f"{part}+{self.world.changed}" for part in
                                        made.snapshots]) if self.world.changed else made

    def execute(self, method, *args, abort_on_failure=True, watch=None):
        self.world.calls.append((method, *args))
        self.world.changed = method
        if self.world.script and self.world.script[0] == (method, "die"):
            self.world.script.pop(0)
            raise WorkerFailedError("a node left", [RankFailure(1, RuntimeError("gone"),
                                                                died=True)])
        return [None, None]

    def attach_data(self, capabilities):
        self.world.calls.append(("attach_data",))

    def watch(self, timeout_s, step, on_commit=None, on_progress=None, on_tick=None):
        self._watch = FakeWatch(on_commit)
        return self._watch

    def execute_pair(self, method, num_steps, profile, info, resume, ticket, watch=None):
        self.world.calls.append(("train", num_steps, info, resume))
        commits, end = self.world.script.pop(0)
        for made in commits:
            watch.on_commit(commit(*made) if isinstance(made, tuple) else commit(made))
        if end == "die":
            raise WorkerFailedError("a node left", [RankFailure(1, RuntimeError("gone"),
                                                                died=True)])
        self.world.step, self.world.changed = end, None
        return [{"metrics": {"step": end}, "first_step_wall": None}] * 2, commit(end, 0)

    def restore(self, to, renew_shards=False):
        if to.step in self.world.lost or to.snapshots[0] in self.world.lost:
            raise lost(to.step)
        self.restored.append(to.step)
        self.world.step = to.step

    def can_replace(self, dead):
        return False

    def placeable_workers(self, want=None):
        return 2 if want is None else want

    def refill_spares(self, avoid=()):
        pass

    def shutdown(self, force=False):
        pass


class World:
    def __init__(self, script, lost=(), cross_nodes=True):
        self.script, self.lost, self.cross_nodes = list(script), set(lost), cross_nodes
        self.groups, self.calls, self.step, self.changed = [], [], 0, None

    def make_group(self, count, recovering):
        group = FakeGroup(self, self.cross_nodes)
        self.groups.append(group)
        return group


def supervisor(world):
    policy = RecoveryPolicy(FailureConfig(backoff_base_s=0, jitter=0), 2, rng=random.Random(0))
    sup = Supervisor(world.make_group, 2, policy, timeout_s=60)
    sup.start()
    return sup


def test_a_commit_lost_before_its_copy_landed_rolls_back_to_the_one_before():
    world = World([([4, 8], "die"), ([], 16)], lost={8})
    sup = supervisor(world)
    assert sup.train(None, False, None, None)[0] == {"step": 16}
    assert world.groups[-1].restored == [4]  # step 8's part went with the node
    assert sup.stats.recoveries == 1 and sup.stats.steps_lost == 4
    assert sup.commit.step == 16


def test_the_newest_commit_is_restored_when_it_survived():
    world = World([([4, 8], "die"), ([], 16)])
    sup = supervisor(world)
    sup.train(None, False, None, None)
    assert world.groups[-1].restored == [8] and sup.stats.steps_lost == 0


def test_without_copies_across_nodes_no_fallback_is_kept_and_the_loss_is_raised():
    # On one node a copy would be no use: the group keeps no second commit in memory.
    world = World([([4, 8], "die")], lost={8}, cross_nodes=False)
    sup = supervisor(world)
    with pytest.raises(ObjectReconstructionFailedError):
        sup.train(None, False, None, None)


def test_a_lost_fallback_too_is_raised_not_retried_forever():
    world = World([([4, 8], "die")], lost={4, 8})
    sup = supervisor(world)
    with pytest.raises(ObjectReconstructionFailedError):
        sup.train(None, False, None, None)


def test_a_lost_call_end_commit_reruns_the_calls_tail_before_the_next_call_starts():
    # train(): a commit at step 4, the end at 8. The next train() fails before its first
    # commit and step 8 went with the node: step 4 is restored, the first call's last 4
    # steps run again (with its info, as a resumed call), then the second call from its
    # start, not as the first call's continuation.
    world = World([([4], 8), ([], "die"), ([], 8), ([], 12)], lost={8})
    sup = supervisor(world)
    sup.train(None, False, {"call": 1}, None)
    assert sup.train(None, False, {"call": 2}, None)[0] == {"step": 12}
    assert world.calls == [("train", None, {"call": 1}, False), ("train", None, {"call": 2}, False),
                           ("train", None, {"call": 1}, True), ("train", None, {"call": 2}, False)]
    assert world.groups[-1].restored == [4] and sup.stats.steps_lost == 4
    assert sup.commit.step == 12 and sup.commit.call_done == 0


def test_the_rerun_tail_of_a_call_of_n_steps_is_what_was_left_of_it():
    world = World([([3], 10), ([], "die"), ([], 10), ([(14, 4)], 15)], lost={10})
    sup = supervisor(world)
    sup.train(10, False, None, None)
    sup.train(5, False, None, None)
    assert world.calls[2:] == [("train", 7, None, True), ("train", 5, None, False)]
    # Nothing lost: a failure runs the call again from the commit it started at.
    world.script += [([], "die"), ([], 20)]
    world.lost = set()
    sup.train(5, False, None, None)
    assert world.calls[-2:] == [("train", 5, None, False), ("train", 5, None, False)]


def test_a_lost_commit_of_a_state_changing_call_runs_that_call_again():
    # train() to step 8, then apply_fn changes every rank's state (a commit of step 8 made
    # by it); the next train() fails and that commit went with the node: the call's own
    # step-8 commit is restored, apply_fn runs again, then the train() call from its start.
    world = World([([], 8), ([], "die"), ([], 12)], lost={"rank0@8+apply_fn"})
    sup = supervisor(world)
    sup.train(None, False, None, None)
    sup.call("apply_fn", "fn", mutates=True)
    sup.train(None, False, None, None)
    assert world.calls == [("train", None, None, False), ("apply_fn", "fn"),
                           ("train", None, None, False), ("apply_fn", "fn"),
                           ("train", None, None, False)]
    assert world.groups[-1].restored == [8] and sup.commit.step == 12


def test_without_copies_across_nodes_nothing_is_kept_to_run_again():
    world = World([([4], 8), ([], "die"), ([], 12)], cross_nodes=False)
    sup = supervisor(world)
    sup.train(None, False, None, None)
    sup.train(None, False, None, None)
    assert world.calls[1:] == [("train", None, None, False)] * 2

