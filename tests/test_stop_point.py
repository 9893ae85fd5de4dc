"""The ranks' agreement on a step to stop train() at (raysgd.worker.stop_point) and the
driver's drain watch (raysgd.driver.preemption), without Ray."""
import threading
import time

import pytest

from raysgd.driver.preemption import DrainWatch, ranks_on, seconds_left
from raysgd.worker.stop_point import NoWordError, StopPoint


def opened(at=0, **kwargs):
    point = StopPoint(**kwargs)
    point.open(at)
    return point


def test_a_rank_accepts_only_a_boundary_it_has_not_passed():
    point = opened()
    for step in range(5):
        assert not point.at_boundary(step)
    assert point.propose(4) == {"accepted": False, "passed": 4, "ended": False}
    assert point.propose(6) == {"accepted": True, "passed": 4, "ended": False}
    assert point.confirm(6)
    assert not point.at_boundary(5)
    assert point.at_boundary(6)  # stops here
    assert point.propose(9)["ended"]  # the stop ended the call


def test_a_rank_at_an_open_proposal_waits_for_the_word_and_a_later_proposal_releases_it():
    point = opened()
    point.at_boundary(0)
    assert point.propose(1)["accepted"]
    seen = []
    rank = threading.Thread(target=lambda: seen.append(point.at_boundary(1)))
    rank.start()
    time.sleep(0.2)
    assert rank.is_alive() and not seen  # it may not pass a step another rank accepts
    assert point.propose(2)["accepted"]  # another rank was past 1: a later step instead
    rank.join(5)
    assert seen == [False]
    assert point.confirm(2)
    assert point.at_boundary(2)


def test_the_confirmation_releases_a_waiting_rank_into_its_stop():
    point = opened()
    point.propose(3)
    seen = []
    rank = threading.Thread(target=lambda: seen.append(point.at_boundary(3)))
    rank.start()
    time.sleep(0.1)
    assert point.confirm(3)
    rank.join(5)
    assert seen == [True]


def test_a_rank_without_the_word_raises_rather_than_train_on_alone():
    point = opened(decide_wait_s=0.05)
    point.propose(1)
    with pytest.raises(NoWordError, match="step 1"):
        point.at_boundary(1)


def test_a_call_that_ended_refuses_proposals_and_leaves_nothing_armed():
    point = opened()
    point.at_boundary(0)
    assert point.propose(5)["accepted"]
    point.close()  # the call ended before step 5
    assert not point.confirm(5)
    assert point.propose(7) == {"accepted": False, "passed": 0, "ended": True}
    point.open(10)  # the next call: nothing of the old proposal is left
    assert not point.at_boundary(10) and not point.confirm(5)
    assert point.propose(10) == {"accepted": False, "passed": 10, "ended": False}
    point.withdraw()
    assert not point.at_boundary(11)


def test_the_drain_watch_asks_at_most_once_a_second_unless_forced():
    now, asked = [0.0], []

    def poll():
        asked.append(now[0])
        return {"n1": 5000}

    watch = DrainWatch(poll, every_s=1.0, clock=lambda: now[0])
    assert watch.check() == {"n1": 5000}
    now[0] = 0.5
    watch.check()
    now[0] = 1.2
    watch.check()
    watch.check(force=True)
    assert asked == [0.0, 1.2, 1.2]


def test_ranks_on_draining_nodes_but_a_rank_in_the_driver():
    assert ranks_on(["a", "b", "b", "c"], {"b": 0}) == [1, 2]
    assert ranks_on(["a", "a"], {"a": 0}, first_remote=1) == [1]
    assert seconds_left(0) is None
    assert seconds_left(15_000, now=5.0) == 10.0
