"""How far apart in-epoch commits are (``raysgd.commits.interval``): no Ray."""
import math

import pytest

from raysgd.commits.interval import (AUTO, LONGEST, START, AutoInterval, CallCost,
                                     FixedInterval, create_interval)
from raysgd.config import check_commit_every
from raysgd.errors import ConfigError


def cost(steps=100, step_s=0.05, commits=10, commit_s=0.01, end_s=0.0):
    """A rank's call: ``steps`` of ``step_s`` each, plus ``commits`` of ``commit_s`` each;
    its call-end commit took ``end_s``."""
    return CallCost(steps, steps * step_s + commits * commit_s, commits, commits * commit_s,
                    end_s)


def test_a_number_is_kept_whatever_commits_cost():
    interval = create_interval(7)
    interval.observe([cost(commit_s=5.0)])
    interval.failed()
    assert interval.current.steps == 7 and interval.current.why == "forced"
    assert isinstance(create_interval(None), FixedInterval)
    assert create_interval(None).current.steps is None


def test_auto_starts_at_the_default_until_a_call_measured_commits():
    interval = create_interval(AUTO)
    assert (interval.current.steps, interval.current.why) == (START, "start")
    interval.observe([cost(commits=0, commit_s=0.0)])  # a call without in-epoch commits
    assert interval.current.steps == START


def test_a_call_too_short_for_an_in_epoch_commit_measures_its_end_commit():
    interval = AutoInterval(budget=0.02)
    interval.observe([cost(steps=30, commits=0, commit_s=0.0, end_s=0.02)])
    assert (interval.current.steps, interval.current.why) == (20, "budget")
    interval.observe([cost(steps=30, commits=0, commit_s=0.0, end_s=0.2)])
    assert interval.current.steps == 20  # a call end stands in only until something better
    interval.observe([cost(commit_s=0.04)])  # an in-epoch figure: smoothed in
    assert interval.current.steps == 30


def test_before_failures_commits_cost_at_most_the_budget():
    interval = AutoInterval(budget=0.02)
    interval.observe([cost(step_s=0.05, commit_s=0.01)])
    # 0.01 s per commit within 2 % of 0.05 s steps: one commit every 10 steps.
    assert (interval.current.steps, interval.current.why) == (10, "budget")
    overhead = 0.01 / (interval.current.steps * 0.05)
    assert overhead <= 0.02


def test_the_slowest_rank_sets_the_interval():
    interval = AutoInterval(budget=0.02)
    interval.observe([cost(step_s=0.05, commit_s=0.01), cost(step_s=0.05, commit_s=0.04)])
    assert interval.current.steps == 40


def test_after_failures_it_is_young_dalys_optimum():
    interval = AutoInterval(budget=0.02)
    for _ in range(10):  # 10 calls of 100 steps: about 51 s of training
        interval.observe([cost(step_s=0.05, commit_s=0.01)])
    interval.failed()
    mtbf = interval.train_s
    expected = math.ceil(math.sqrt(2 * 0.01 * mtbf) / 0.05)
    assert (interval.current.steps, interval.current.why) == (expected, "young-daly")
    interval.failed()  # failures twice as often: commits closer together
    assert interval.current.steps == math.ceil(math.sqrt(2 * 0.01 * mtbf / 2) / 0.05)
    assert interval.current.steps < expected


def test_a_failure_before_any_measurement_keeps_the_start():
    interval = AutoInterval()
    interval.failed()
    assert interval.current.steps == START


def test_the_choice_divides_the_disk_interval():
    interval = create_interval(AUTO, divides=64)
    assert interval.current.steps == 32  # the start (50) lowered to a divisor of 64
    interval.observe([cost(step_s=0.05, commit_s=0.01)])
    assert interval.current.steps == 8  # 10 lowered to a divisor of 64


def test_estimates_are_smoothed_and_bounded():
    interval = AutoInterval(budget=0.02)
    interval.observe([cost(step_s=0.05, commit_s=0.01)])
    interval.observe([cost(step_s=0.05, commit_s=0.03)])
    assert interval.current.steps == 20  # halfway: 0.02 s per commit
    interval.observe([cost(step_s=1e-9, commit_s=100.0)])
    assert interval.current.steps == LONGEST
    interval.observe([cost(step_s=10.0, commit_s=1e-9)])
    interval.observe([cost(step_s=10.0, commit_s=1e-9)])
    assert interval.current.steps >= 1


@pytest.mark.parametrize("value", ["auto", 1, 50, None])
def test_checkpoint_every_n_steps_accepts(value):
    assert check_commit_every(value) == value


@pytest.mark.parametrize("value", ["Auto", 0, -3, 2.5, True])
def test_checkpoint_every_n_steps_refuses(value):
    with pytest.raises(ConfigError, match='"auto"'):
        check_commit_every(value)
