"""The retry policy with a fake clock: milliseconds, no Ray."""
import random

import pytest

from raysgd.driver.recovery import RecoveryPolicy
from raysgd.errors import ConfigError
from raysgd.recovery import FailureConfig


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def policy(num_workers=2, **kwargs):
    clock = FakeClock()
    p = RecoveryPolicy(FailureConfig(**kwargs), num_workers, clock=clock, rng=random.Random(0))
    p.start_call()
    return p, clock


def test_backoff_sequence_is_exponential_capped_and_starts_at_zero():
    p, _ = policy(backoff_base_s=1, backoff_cap_s=5, jitter=0)
    assert [p.backoff_s(a) for a in range(1, 7)] == [0, 1, 2, 4, 5, 5]


def test_jitter_stays_within_bounds():
    p, _ = policy(backoff_base_s=2, backoff_cap_s=100, jitter=0.5)
    for attempt in range(2, 8):
        ceiling = min(100, 2 * 2 ** (attempt - 2))
        waits = [p.backoff_s(attempt) for _ in range(200)]
        assert all(ceiling * 0.5 <= w <= ceiling for w in waits)
        assert max(waits) - min(waits) > 0  # it does vary


def test_max_retries_bounds_recoveries_per_call():
    p, _ = policy(max_retries=2, jitter=0)
    assert p.on_failure(2).retry and p.on_failure(2).retry
    decision = p.on_failure(2)
    assert not decision.retry and "max_retries=2" in decision.reason
    p.start_call()  # a new train() call gets a fresh count
    assert p.on_failure(2).retry


def test_max_retries_zero_raises_at_once_and_call_override():
    p, _ = policy(max_retries=3)
    p.start_call(max_retries=0)
    assert not p.on_failure(2).retry


def test_budget_exhaustion():
    p, clock = policy(max_retries=100, backoff_base_s=10, backoff_cap_s=10, jitter=0, budget_s=25)
    assert p.on_failure(2).wait_s == 0
    clock.now += 5
    assert p.on_failure(2).retry  # 5 + 10 <= 25
    clock.now += 12
    decision = p.on_failure(2)  # 17 + 10 > 25
    assert not decision.retry and "budget" in decision.reason


def test_resize_decisions():
    p, _ = policy(num_workers=4, min_workers=2, jitter=0)
    full = p.on_failure(5)
    assert full.num_workers == 4 and full.reason == "restart"
    smaller = p.on_failure(3)
    assert smaller.retry and smaller.num_workers == 3 and "resize to 3 of 4" in smaller.reason
    starved = p.on_failure(1)
    assert starved.retry and starved.num_workers == 0 and starved.wait_s > 0
    assert "min_workers=2" in starved.reason


def test_scale_up_waits_for_the_cooldown():
    p, clock = policy(num_workers=4, scale_up_cooldown_s=30)
    p.resized()
    assert p.scale_up_target(current=2, placeable_extra=2) == 2
    clock.now += 31
    assert p.scale_up_target(current=2, placeable_extra=1) == 3
    assert p.scale_up_target(current=2, placeable_extra=9) == 4
    assert p.scale_up_target(current=4, placeable_extra=9) == 4
    assert p.scale_up_target(current=2, placeable_extra=0) == 2


@pytest.mark.parametrize("kwargs", [{"max_retries": -1}, {"min_workers": 0}, {"jitter": 2},
                                    {"backoff_cap_s": -1}, {"max_retries": 1.5}])
def test_invalid_config(kwargs):
    with pytest.raises(ConfigError):
        FailureConfig(**kwargs)


def test_min_workers_above_num_workers():
    with pytest.raises(ConfigError, match="min_workers=3"):
        RecoveryPolicy(FailureConfig(min_workers=3), 2)


def test_waiting_for_capacity_spends_the_budget_not_the_retries():
    p, clock = policy(max_retries=1, backoff_base_s=2, backoff_cap_s=2, jitter=0, budget_s=9)
    assert p.on_failure(0).num_workers == 0  # nothing placeable: wait
    for _ in range(4):
        decision = p.on_no_capacity(0)
        assert decision.retry and decision.wait_s == 2
        clock.now += 2
    assert not p.on_no_capacity(0).retry  # 8 s spent + a 2 s wait > the 9 s budget
    assert p.on_no_capacity(2).retry is False
