"""The supervisor's fallback commit (``raysgd.driver.supervisor``) with a fake worker group:
no Ray. A node lost before the newest commit's copy landed on another node takes that
commit along; the recovery then restores the commit before it instead of failing."""
import random

import pytest
from ray.exceptions import ObjectReconstructionFailedError

from raysgd.driver.recovery import RecoveryPolicy
from raysgd.driver.supervisor import Supervisor
from raysgd.errors import RankFailure, WorkerFailedError
from raysgd.recovery import FailureConfig
from raysgd.state.commit import Commit


def commit(step):
    return Commit(step, step, 2, [f"rank0@{step}", f"rank1@{step}"])


def lost(step):
    return ObjectReconstructionFailedError("ab" * 14, reason_message=f"part of step {step} lost")


class FakeWatch:
    class monitor:
        reports = {}

    def __init__(self, on_commit):
        self.on_commit = on_commit


class FakeGroup:
    """Two ranks. ``script``: what each ``train_and_commit`` call does, in turn: a list of
    steps to commit inside the call, then ``"die"`` (a worker dies) or a step to return."""

    def __init__(self, world, cross_nodes):
        self.world, self.copies_cross_nodes = world, cross_nodes
        self.num_workers, self.left_running, self.restored = 2, False, []
        self._watch = None

    def start(self):
        return [{}, {}]

    def snapshot(self):
        return commit(0)

    def watch(self, timeout_s, step, on_commit=None, on_progress=None, on_tick=None):
        self._watch = FakeWatch(on_commit)
        return self._watch

    def execute_pair(self, method, *args, watch=None):
        commits, end = self.world.script.pop(0)
        for step in commits:
            watch.on_commit(commit(step))
        if end == "die":
            raise WorkerFailedError("a node left", [RankFailure(1, RuntimeError("gone"),
                                                                died=True)])
        return [{"metrics": {"step": end}, "first_step_wall": None}] * 2, commit(end)

    def restore(self, to, renew_shards=False):
        if to.step in self.world.lost:
            raise lost(to.step)
        self.restored.append(to.step)

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
        self.groups = []

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
