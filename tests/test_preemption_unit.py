"""The supervisor's hand-over on a preemption notice (``raysgd.driver.preemption``) with a
fake worker group and a scripted drain map: no Ray. The 3-node run with Ray's real drain
API is ``cluster_preemption.py``."""
import random
import time

from raysgd.driver.preemption import DrainWatch
from raysgd.driver.recovery import RecoveryPolicy
from raysgd.driver.replicas import NO_COPIES
from raysgd.driver.supervisor import Supervisor
from raysgd.errors import ResourcesUnavailableError
from raysgd.recovery import FailureConfig
from raysgd.state.commit import Commit


def commit(step, call_done=0):
    return Commit(step, call_done, 2, [f"rank0@{step}", f"rank1@{step}"])


class FakeWatch:
    ticket = 1

    class monitor:
        reports = {}


class FakeGroup:
    """Two ranks on node ``a``. Each ``train_and_commit`` runs the watch's ticks; once
    ``agree_stop`` was called the call returns stopped at step 5, else it ends at 10."""

    def __init__(self, world):
        self.world, self.num_workers, self.left_running = world, 2, False
        self.rank_nodes = ["a", "a"]
        self.restored, self.replaced, self.spares_stopped, self.stop_asked = [], [], [], 0
        self.on_tick = None

    def start(self):
        return [{}, {}]

    def copy_commit(self, commit):
        return NO_COPIES  # one node: every commit is restorable at once

    def snapshot(self):
        return commit(0)

    def watch(self, timeout_s, step, on_commit=None, on_progress=None, on_tick=None):
        self.on_tick = on_tick
        return FakeWatch()

    def execute_pair(self, method, remaining, profile, info, resume, ticket, every,
                     watch=None):
        self.world.calls.append((remaining, resume))
        self.world.draining.update(self.world.drain_in_call)
        for _ in range(3):
            self.on_tick()
        if self.stop_asked and not resume:
            return [{"step": 5, "call_done": 5, "stopped": True, "metrics": None,
                     "first_step_wall": None}] * 2, commit(5, 5)
        return [{"metrics": {"end": 10}, "first_step_wall": None}] * 2, commit(10)

    def agree_stop(self):
        self.stop_asked += 1
        return 5

    def movable(self, ranks):
        return not self.world.unmovable

    def replace(self, ranks, avoid, placement_timeout_s):
        if self.world.no_room:
            raise ResourcesUnavailableError("no room")
        self.replaced.append((list(ranks), set(avoid)))
        self.rank_nodes = ["b", "b"]
        return [{}, {}]

    def spares_on(self, nodes):
        self.spares_stopped.append(set(nodes))
        return 0

    def restore(self, to, renew_shards=False):
        self.restored.append(to.step)

    def refill_spares(self, avoid=()):
        self.world.refill_avoid.append(set(avoid))

    def shutdown(self, force=False):
        pass


class World:
    def __init__(self, draining, no_room=False, drain_in_call=None, unmovable=False):
        self.draining, self.no_room, self.unmovable = draining, no_room, unmovable
        self.drain_in_call = drain_in_call or {}  # drains that appear once a call runs
        self.calls, self.refill_avoid, self.groups = [], [], []

    def make_group(self, count, recovering):
        self.groups.append(FakeGroup(self))
        return self.groups[-1]


def supervisor(world):
    policy = RecoveryPolicy(FailureConfig(backoff_base_s=0, jitter=0), 2, rng=random.Random(0))
    sup = Supervisor(world.make_group, 2, policy, timeout_s=60,
                     drains=DrainWatch(lambda: dict(world.draining), every_s=0.0))
    sup.start()
    return sup


def test_a_drain_mid_train_stops_moves_the_ranks_and_resumes_from_the_stop():
    world = World({}, drain_in_call={"a": 0})
    sup = supervisor(world)
    group = world.groups[0]
    assert sup.train(None, False, None, None)[0] == {"end": 10}
    assert group.stop_asked == 1  # once, however many ticks saw the drain
    assert group.replaced == [([0, 1], {"a"})] and group.restored == [5]
    assert world.calls == [(None, False), (None, True)]  # resumed, not started over
    assert sup.stats.preemptions == 1 and sup.stats.failures == 0 and sup.stats.steps_lost == 0
    assert len(sup.stats.handover_times_s) == 1
    assert {"a"} in world.refill_avoid  # no spare is planned on the draining node
    assert world.groups == [group]  # the same group: nobody restarted


def test_a_drain_seen_before_a_call_moves_the_ranks_without_a_stop():
    world = World({"a": 0})
    sup = supervisor(world)
    group = world.groups[0]
    sup.train(None, False, None, None)
    assert group.stop_asked == 0 and group.replaced == [([0, 1], {"a"})]
    assert group.restored == [0] and sup.stats.preemptions == 1


def test_without_room_elsewhere_the_ranks_train_on_and_are_not_stopped_again():
    world = World({}, no_room=True, drain_in_call={"a": 0})
    sup = supervisor(world)
    group = world.groups[0]
    sup.train(None, False, None, None)
    assert group.stop_asked == 1 and group.replaced == []
    assert group.restored == [5]  # resumed in place from the stop's commit
    sup.train(None, False, None, None)
    assert group.stop_asked == 1  # the node is not acted on again
    assert sup.stats.preemptions == 0 and sup.stats.failures == 0


def test_ranks_that_may_not_move_train_on_without_a_move():
    world = World({}, unmovable=True, drain_in_call={"a": 0})
    sup = supervisor(world)
    group = world.groups[0]
    sup.train(None, False, None, None)
    assert group.replaced == [] and group.restored == [5]
    assert sup.stats.preemptions == 0 and sup.stats.handover_times_s == []


def test_a_drain_that_ends_and_comes_again_is_acted_on_again():
    world = World({}, no_room=True, drain_in_call={"a": 0})
    sup = supervisor(world)
    group = world.groups[0]
    sup.train(None, False, None, None)
    world.draining, world.drain_in_call, world.no_room = {}, {}, False
    sup.train(None, False, None, None)  # the drain was cancelled
    world.draining = {"a": 0}
    sup.train(None, False, None, None)
    assert group.replaced == [([0, 1], {"a"})] and sup.stats.preemptions == 1


def test_the_drivers_own_drain_stops_once_saves_that_commit_and_trains_on():
    """Nothing moves the driver: the ranks stop at one step, the trainer's callback gets
    that commit (it writes it to checkpoint_dir), and the call resumes where it stopped."""
    world = World({}, drain_in_call={"driver-node": int((time.time() + 30) * 1000)})
    saved = []
    policy = RecoveryPolicy(FailureConfig(backoff_base_s=0, jitter=0), 2, rng=random.Random(0))
    sup = Supervisor(world.make_group, 2, policy, timeout_s=60,
                     drains=DrainWatch(lambda: dict(world.draining), every_s=0.0),
                     on_driver_drain=lambda commit, left: saved.append((commit.step, left)))
    sup._driver_node = "driver-node"  # no Ray here: the node this driver would be on
    sup.start()
    group = world.groups[0]
    assert sup.train(None, False, None, None)[0] == {"end": 10}
    assert group.stop_asked == 1 and [step for step, _ in saved] == [5]
    assert 20 < saved[0][1] <= 30  # seconds left before the deadline
    assert group.restored == [5] and group.replaced == []
    assert world.calls == [(None, False), (None, True)]
    assert sup.stats.preemptions == 0 and sup.stats.handover_times_s == []
    sup.train(None, False, None, None)
    assert group.stop_asked == 1 and len(saved) == 1  # once per drain
