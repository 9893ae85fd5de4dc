"""A survivor's live state standing in for the commit, and per-step RNG seeds: no Ray.

A failure is simulated the way a dead peer shows on a survivor: the batch in flight raises
after its forward and backward, before its optimizer step (where DDP's all-reduce fails).
"""
import random

import numpy as np
import pytest
import torch
from torch import nn

from operators_for_tests import DropoutOperator, PeerDied
from raysgd.config import RankInfo, WorkerSettings
from raysgd.driver.survivors import choose_source
from raysgd.utils import BATCH_SIZE
from raysgd.worker import step_seeds
from raysgd.worker.runner import WorkerRunner
from raysgd.worker.survivor import SurvivorPoint


CONFIG = {BATCH_SIZE: 50, "shuffle": True}


def make_runner(cls=DropoutOperator, config=CONFIG):
    runner = WorkerRunner(cls, dict(config), WorkerSettings(), RankInfo())
    runner.setup_operator()
    return runner


def weights(runner):
    return [p.detach().clone() for p in runner.operator.model.parameters()]


def failed_at(step):
    """A runner whose second call dies in the batch of ``step``."""
    runner = make_runner()
    runner.train_epoch()  # 20 batches
    runner.operator.fail_at = step
    with pytest.raises(PeerDied):
        runner.train_epoch()
    return runner


# ------------------------------------------------------------------ step seeds
def test_step_seeds_depend_on_base_rank_and_step_only():
    seeds = {step_seeds.step_seed(base, rank, step)
             for base in (1, 2) for rank in (0, 1) for step in range(50)}
    assert len(seeds) == 200 and all(0 <= seed < 2 ** 63 for seed in seeds)
    assert step_seeds.step_seed(7, 1, 3) == step_seeds.step_seed(7, 1, 3)


def test_seeding_a_step_replays_every_generator():
    def draws():
        return torch.rand(3).tolist(), np.random.rand(), random.random()

    step_seeds.seed_step(11, 0, 5)
    first = draws()
    draws()
    step_seeds.seed_step(11, 0, 5)
    assert draws() == first
    step_seeds.seed_step(11, 1, 5)
    assert draws() != first


def test_the_base_is_hashed_without_drawing():
    torch.manual_seed(3)
    before = torch.get_rng_state()
    base = step_seeds.base_from_rng()
    assert torch.equal(torch.get_rng_state(), before) and base == step_seeds.base_from_rng()
    torch.manual_seed(4)
    assert step_seeds.base_from_rng() != base


# ------------------------------------------------------------- the mark's checks
def test_a_batch_that_died_before_its_step_leaves_the_state_at_its_start():
    runner = failed_at(25)
    point = runner.survivor_point()
    assert point == {"step": 25, "has_buffers": False, "why_not": None}


def test_a_step_or_a_finished_batch_moves_the_state_past_the_mark():
    runner = make_runner()
    runner.train_epoch(num_steps=3)
    assert runner.survivor_point()["step"] is None  # the call ended: no batch under way
    runner._survivor.mark(3, runner._passes.state_dict, runner.operator.global_step, 3)
    runner.operator.optimizer.step()
    assert "optimizer stepped" in runner.survivor_point()["why_not"]
    runner._survivor.mark(3, runner._passes.state_dict, runner.operator.global_step, 3)
    runner.operator.global_step += 1
    assert "finished" in runner.survivor_point()["why_not"]


def test_a_buffer_written_in_the_batch_moves_the_state_past_the_mark():
    point = SurvivorPoint()
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    runner = make_runner()
    point.attach(runner.operator._context.strategy, [model], [optimizer])
    point.mark(0, dict, 0, 0)
    assert point.reason(0) is None and point.has_buffers
    model(torch.randn(4, 2))  # batch norm updates its running statistics
    assert "buffer" in point.reason(0)


def test_strategies_and_optimizers_that_cannot_serve_say_why():
    runner = make_runner()

    class Sharded:
        replicated = False

    operator = runner.operator
    point = SurvivorPoint()
    point.attach(Sharded(), operator._original_models, operator._optimizers)
    assert "shards" in point.reason(0)

    class Custom:  # not a torch.optim.Optimizer
        pass

    point.attach(operator._context.strategy, operator._original_models, [Custom()])
    assert "cannot be counted" in point.reason(0)


# ------------------------------------------------ the hand-over, end to end in-process
@pytest.mark.parametrize("as_newcomer", [False, True])
def test_the_survivors_state_resumes_bitwise_where_the_unfaulted_run_goes(as_newcomer):
    reference = make_runner()
    reference.train_epoch()
    expected = reference.train_epoch()

    survivor = failed_at(25)  # 5 batches into the second call
    header, full = survivor.survivor_snapshot(True)
    assert header["step"] == 25 and header["call_done"] == 5 and full["meters"] is not None
    own = {**header["own"], "meters": None} if as_newcomer else full
    resumed = make_runner()  # a fresh operator, as after a re-set-up
    resumed.restore(full, own)
    result = resumed.train_epoch(resume=True)
    for got, want in zip(weights(resumed), weights(reference)):
        assert torch.equal(got, want)
    assert result["epoch"] == expected["epoch"] == 2
    if as_newcomer:  # a dead rank's metrics of that call start at the hand-over
        assert result["batch_count"] == 15
    else:
        assert result["batch_count"] == expected["batch_count"] == 20
        assert result["train_loss"] == pytest.approx(expected["train_loss"], rel=1e-12)


def test_a_restored_runner_draws_what_the_original_drew():
    """Seeds come from the run's base, carried in commits: a fresh process restoring a
    commit draws the same dropout masks as the process that took it."""
    first = make_runner()
    first.train_epoch(num_steps=4)
    _, snap = first.snapshot_pair()
    other = make_runner(config={**CONFIG, "unrelated": 1})
    torch.manual_seed(999)  # whatever this process drew before does not matter
    other.restore(snap, snap)
    first.train_epoch(num_steps=3)
    other.train_epoch(num_steps=3)
    for got, want in zip(weights(other), weights(first)):
        assert torch.equal(got, want)


# ------------------------------------------------------------- the driver's choice
def point(step, buffers=False, why=None):
    return {"step": step, "has_buffers": buffers, "why_not": why}


def test_the_source_is_rank_0_or_the_lowest_survivor():
    assert choose_source([1], {0: point(9), 2: point(9)}) == 0
    assert choose_source([0], {1: point(9), 2: point(9)}) == 1


def test_no_source_when_survivors_disagree_or_cannot_serve(caplog):
    caplog.set_level("INFO", logger="raysgd")
    assert choose_source([1], {0: point(9), 2: point(10)}) is None
    assert choose_source([1], {0: point(None, why="an optimizer stepped"), 2: point(9)}) is None
    assert "an optimizer stepped" in caplog.text
    # rank 0's buffers are what DDP hands every rank at each forward: no survivor has them
    assert choose_source([0], {1: point(9, buffers=True)}) is None
    assert choose_source([1], {0: point(9, buffers=True)}) == 0
