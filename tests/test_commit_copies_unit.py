"""Which commit the supervisor restores while copies land (``raysgd.driver.supervisor`` on
``raysgd.commits.protocol``), with a fake worker group: no Ray.

A commit whose part lives on a worker's node is pending until its copy to another node
landed: restored while that node lives, passed over for the newest copied one when the node
went first. A call returns only once its end commit's copies landed, so nothing a call
returned can be taken back by a lost node, and nothing has to be run again between calls."""
import random

import pytest
from ray.exceptions import ObjectReconstructionFailedError

from raysgd.driver.recovery import RecoveryPolicy
from raysgd.driver.supervisor import Supervisor
from raysgd.errors import CheckpointError, RankFailure, WorkerFailedError
from raysgd.recovery import FailureConfig
from raysgd.state.commit import Commit


def commit(step, call_done=None):
    return Commit(step, step if call_done is None else call_done, 2,
                  [f"rank0@{step}", f"rank1@{step}"])


NEVER = "never"


class FakeLanding:
    """Rank 1's part is made on node ``b``; it lands after ``world.polls[step]`` looks
    (``NEVER``: not at all)."""

    failed = ()  # every copy can be made (while node b lives)

    def __init__(self, world, step):
        self.world, self.step, self.sources = world, step, {1: "b"}

    def landed(self, timeout_s=0.0):
        if self.step in self.world.lose_before_landing:  # node b goes first
            self.world.lose_before_landing.discard(self.step)
            self.world.dead.add("b")
        left = self.world.polls.get(self.step, 0)
        if left == NEVER:
            return False
        self.world.polls[self.step] = left - 1
        return left <= 0 and "b" not in self.world.dead

    def sources_gone(self):
        return {1} if "b" in self.world.dead else set()

    def readable(self, made):
        return made


class FakeWatch:
    ticket = 1

    class monitor:
        reports = {}


class FakeGroup:
    """Two ranks, rank 1 on node ``b``. ``world.script``: per ``train_and_commit``, the
    in-epoch commits it makes (the watch ticks after each), then ``"die"`` (node ``b`` goes:
    rank 1 with it), ``"kill"`` (rank 1's process dies) or the step it ends at."""

    def __init__(self, world):
        self.world, self.num_workers, self.left_running, self.restored = world, 2, False, []

    def start(self):
        return [{}, {}]

    def snapshot(self):
        return commit(self.world.step, call_done=0)

    def copy_commit(self, made):
        return FakeLanding(self.world, made.step)

    def gone_nodes(self, nodes):
        return set(nodes) & self.world.dead

    def execute(self, method, *args, abort_on_failure=True, watch=None):
        self.world.calls.append((method, *args))
        return [self.world.step] * 2

    def watch(self, timeout_s, step, on_commit=None, on_progress=None, on_tick=None):
        self.on_commit, self.on_tick = on_commit, on_tick
        return FakeWatch()

    def execute_pair(self, method, num_steps, profile, info, resume, ticket, every, watch=None):
        self.world.calls.append(("train", num_steps, resume))
        made, end = self.world.script.pop(0)
        for step in made:
            self.on_commit(commit(step))
            self.on_tick()
        if end in ("die", "kill"):
            if end == "die":  # the node; "kill": rank 1's process alone
                self.world.dead.add("b")
            raise WorkerFailedError("a node left", [RankFailure(1, RuntimeError("gone"),
                                                                died=True)])
        self.world.step = end
        return [{"metrics": {"step": end}, "first_step_wall": None}] * 2, commit(end, 0)

    def restore(self, to, renew_shards=False):
        if to.step in self.world.lost:
            raise WorkerFailedError("lost", [RankFailure(1, ObjectReconstructionFailedError(
                "ab" * 14, reason_message="gone"))])
        self.restored.append(to.step)
        self.world.step = to.step
        self.world.dead.discard("b")  # the newcomer's node

    def can_replace(self, dead):
        return False

    def placeable_workers(self, want=None):
        return 2 if want is None else want

    def refill_spares(self, avoid=()):
        pass

    def shutdown(self, force=False):
        pass


class World:
    def __init__(self, script, polls=None, lost=(), lose_before_landing=()):
        self.script, self.polls, self.lost = list(script), dict(polls or {}), set(lost)
        self.lose_before_landing = set(lose_before_landing)  # steps whose copy node b beats
        self.groups, self.calls, self.step, self.dead = [], [], 0, set()

    def make_group(self, count, recovering):
        group = FakeGroup(self)
        self.groups.append(group)
        return group


def supervisor(world):
    policy = RecoveryPolicy(FailureConfig(backoff_base_s=0, jitter=0), 2, rng=random.Random(0))
    sup = Supervisor(world.make_group, 2, policy, timeout_s=60)
    sup.start()
    return sup


def test_a_pending_commit_is_passed_over_when_its_node_went_before_the_copy_landed():
    # Step 4's copy lands at the watch's tick, step 8's never does before node b goes.
    world = World([([4, 8], "die"), ([], 16)], polls={8: NEVER})
    sup = supervisor(world)
    assert sup.train(None, False, None, None)[0] == {"step": 16}
    assert world.groups[-1].restored == [4]
    assert sup.stats.steps_lost == 4  # the failed call reached 8, as the commit said
    assert sup.commits.current.step == 16 and sup.commits.pending == []


def test_a_pending_commit_is_restored_while_its_node_lives():
    # A rank killed, its node alive: step 8 is still whole though not yet copied.
    world = World([([4, 8], "kill"), ([], 16)], polls={8: NEVER})
    sup = supervisor(world)
    sup.train(None, False, None, None)
    assert world.groups[-1].restored == [8] and sup.stats.steps_lost == 0


def test_a_call_returns_only_once_its_end_commit_was_copied():
    world = World([([], 8)], polls={8: 3})
    sup = supervisor(world)
    sup.train(None, False, None, None)
    assert world.polls[8] < 0  # looked at until it landed
    assert sup.commits.current.step == 8


def test_a_node_lost_before_the_end_commit_landed_is_recovered_inside_the_call():
    # The call ends at 8 but b goes before that commit is copied: the call resumes from
    # step 4 (copied) and ends again; nothing is owed to the next call.
    world = World([([4], 8), ([], 8), ([], 12)], lose_before_landing={8})
    sup = supervisor(world)
    assert sup.train(None, False, {"call": 1}, None)[0] == {"step": 8}
    assert world.groups[-1].restored == [4]
    assert world.calls[-2:] == [("train", None, False), ("train", None, True)]
    assert sup.commits.current.step == 8
    sup.train(None, False, {"call": 2}, None)
    assert world.calls[-1] == ("train", None, False)  # its own start, nothing run again


def test_a_state_changing_calls_commit_lost_before_its_copy_runs_the_call_again():
    world = World([([], 8)])
    sup = supervisor(world)
    sup.train(None, False, None, None)
    world.lose_before_landing.add(8)  # apply_fn's commit (step 8 too) goes with node b
    world.polls[8] = 0
    sup.call("apply_fn", "fn", mutates=True)
    assert world.calls[-2:] == [("apply_fn", "fn"), ("apply_fn", "fn")]
    assert world.groups[-1].restored == [8]  # the train() call's end, copied


def test_a_part_ray_lost_after_all_is_passed_over_for_the_next_commit():
    world = World([([4, 8], "kill"), ([], 16)], polls={8: NEVER}, lost={8})
    sup = supervisor(world)
    sup.train(None, False, None, None)
    assert world.groups[-1].restored == [4]


def test_nothing_left_to_restore_is_said_not_retried():
    world = World([([4, 8], "die")], polls={0: NEVER, 4: NEVER, 8: NEVER})
    policy = RecoveryPolicy(FailureConfig(backoff_base_s=0, jitter=0), 2, rng=random.Random(0))
    sup = Supervisor(world.make_group, 2, policy, timeout_s=0.01)
    sup.start()  # its commit's copy does not land within timeout_s: it stays pending
    with pytest.raises(CheckpointError, match="nothing is left to restore"):
        sup.train(None, False, None, None)
