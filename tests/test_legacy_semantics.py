"""Ray 1.12's call semantics with 2 real workers (gloo), and what happens to the trained
state when user code raises on one rank."""
import os

import pytest
import torch

from cluster_scripts import WAIT_S as CLUSTER_WAIT_S, cluster_result
from operators_for_tests import KeywordEpochOperator, LinearOperator, RaisingOperator
from raysgd import TorchTrainer
from raysgd.state.checkpoint import load as load_checkpoint
from raysgd.torch.constants import NUM_STEPS, SCHEDULER_STEP, USE_FP16
from raysgd.utils import BATCH_SIZE

pytestmark = pytest.mark.timeout(240)


def weights(trainer_or_state):
    state = trainer_or_state if isinstance(trainer_or_state, dict) else trainer_or_state.state_dict()
    return {k: v.clone() for k, v in state["models"][0].items()}


def assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), (key, a[key], b[key])


def test_keyword_train_epoch_gets_num_steps_epoch_idx_and_legacy_info(trainer_factory):
    # 1000 samples, 500 per worker, 125 per batch: 4 batches a pass.
    trainer = trainer_factory(KeywordEpochOperator, scheduler_step_freq="manual",
                              config={BATCH_SIZE: 250})
    first = trainer.train(reduce_results=False)
    assert [r["num_steps"] for r in first] == [-1, -1] and [r["epoch_idx"] for r in first] == [0, 0]
    second = trainer.train(num_steps=3, reduce_results=False, info={"mine": 1})
    assert [(r["batches"], r["num_steps"], r["epoch_idx"]) for r in second] == [(3, 3, 1)] * 2
    keys = set(second[0]["info_keys"])
    assert {NUM_STEPS, SCHEDULER_STEP, USE_FP16, "epoch_idx", "mine"} <= keys


def test_validate_num_steps_continues_on_each_workers_shard(trainer_factory):
    # 400 validation samples, 200 per worker's shard, 50 per batch: 4 batches a pass.
    trainer = trainer_factory(KeywordEpochOperator, config={BATCH_SIZE: 100, "val_size": 400})
    whole = trainer.validate(reduce_results=False)
    assert [r["count"] for r in whole] == [200, 200]
    part1 = trainer.validate(num_steps=3, reduce_results=False)
    part2 = trainer.validate(num_steps=3, reduce_results=False)  # batch 3, then wraps to 0, 1
    for rank in range(2):
        assert part1[rank]["first"] == whole[rank]["first"] and part1[rank]["count"] == 150
        assert part2[rank]["count"] == 150 and part2[rank]["info_num_steps"] == 3
        assert part2[rank]["first"] != part1[rank]["first"]  # continued, not restarted
    rest = trainer.validate(reduce_results=False)  # finishes the pass it is in
    assert [r["count"] for r in rest] == [100, 100]
    assert [r["count"] for r in trainer.validate(reduce_results=False)] == [200, 200]


@pytest.mark.slow
def test_user_exception_on_one_rank_rolls_back_to_the_last_commit(trainer_factory, tmp_path):
    """Rank 1 raises mid-epoch while rank 0 waits in DDP's all-reduce: the error reaches the
    driver with its type and rank, the workers restart from the last in-epoch commit, and the
    saved weights are exactly that commit's (an unfaulted run says what they must be)."""
    config = {BATCH_SIZE: 64, "seed": 3}  # 16 batches a pass
    reference = trainer_factory(RaisingOperator, config=config, checkpoint_every_n_steps=3)
    reference.train()
    reference.train(num_steps=5)  # the commit at step 21 = 16 + 5 batches done
    at_commit = weights(reference)
    reference.train()
    after_pass_2 = weights(reference)
    reference.shutdown()

    trainer = trainer_factory(RaisingOperator, config=config, checkpoint_every_n_steps=3)
    trainer.train()
    pids = trainer.apply_all_workers(os.getpid)
    trainer.apply_all_operators(lambda op: setattr(op, "fail_step", 23) or
                                setattr(op, "fail_ranks", (1,)))
    with pytest.raises(KeyError, match="missing-key at step 23") as info:
        trainer.train()
    assert "rank 1" in "\n".join(info.value.__notes__)
    stats = trainer.recovery_stats
    assert stats.user_errors == 1 and stats.recoveries == 0
    assert trainer.apply_all_workers(os.getpid) != pids  # rank 0 was stuck: restarted

    path = trainer.save(str(tmp_path / "after_error.pt"))
    assert_same(weights(load_checkpoint(path)), at_commit)
    assert_same(dict(trainer.get_model().state_dict()), at_commit)
    assert trainer.validate()["num_samples"] == 400
    # The failure flag lived in the old processes; training picks up at the commit.
    result = trainer.train()
    assert result["epoch"] == 2 and result["batch_count"] == 16 - 5
    assert_same(weights(trainer), after_pass_2)


@pytest.mark.slow
def test_user_exception_on_every_rank_rolls_back_in_place(trainer_factory):
    config = {BATCH_SIZE: 64, "seed": 4}
    trainer = trainer_factory(RaisingOperator, config=config, checkpoint_every_n_steps=None)
    trainer.train()
    before = weights(trainer)
    pids = trainer.apply_all_workers(os.getpid)
    trainer.apply_all_operators(lambda op: setattr(op, "fail_step", 20) or
                                setattr(op, "fail_ranks", (0, 1)))
    with pytest.raises(KeyError):
        trainer.train()
    assert trainer.apply_all_workers(os.getpid) == pids  # no rank was stuck: same processes
    assert_same(weights(trainer), before)  # the commit of the last train() call
    assert trainer.apply_all_operators(lambda op: op.global_step) == [16, 16]
    trainer.apply_all_operators(lambda op: setattr(op, "fail_step", None))
    assert trainer.train()["epoch"] == 2
    assert trainer.recovery_stats.user_errors == 1


def test_placement_that_cannot_be_met_is_a_timeout_error(trainer_factory):
    trainer_factory(num_workers=3)  # holds 3 of the 4 CPUs
    with pytest.raises(TimeoutError, match="within 1s"):
        TorchTrainer(training_operator_cls=LinearOperator, num_workers=2, use_gpu=False,
                     placement_timeout_s=1, placement_strategy="SPREAD")
    with pytest.raises(TimeoutError, match="whole cluster has CPU: 4"):
        TorchTrainer(training_operator_cls=LinearOperator, num_workers=7, use_gpu=False)
    with pytest.raises(TimeoutError, match="STRICT_SPREAD.*needs 2 nodes"):
        TorchTrainer(training_operator_cls=LinearOperator, num_workers=2, use_gpu=False,
                     placement_strategy="STRICT_SPREAD")


@pytest.mark.slow
def test_ctrl_c_in_the_driver_rolls_back_and_keeps_the_trainer(trainer_factory):
    """With use_local, rank 0 trains in the driver's thread, where a Ctrl-C lands."""
    from operators_for_tests import InterruptedOperator

    trainer = trainer_factory(InterruptedOperator, num_workers=1, use_local=True,
                              config={BATCH_SIZE: 64, "seed": 5}, checkpoint_every_n_steps=None)
    trainer.train()
    before = weights(trainer)
    trainer.get_local_operator().fail_step, trainer.get_local_operator().fail_ranks = 20, (0,)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert_same(weights(trainer), before)
    assert trainer.get_local_operator().fail_step is None  # a fresh operator, restored
    assert trainer.train()["epoch"] == 2 and trainer.recovery_stats.user_errors == 1


@pytest.mark.slow
@pytest.mark.timeout(CLUSTER_WAIT_S + 60)
def test_placement_strategies_on_three_nodes(bench_quick):
    seen = cluster_result(bench_quick, "cluster_placement.py")  # a background job
    assert seen["PACK"]["nodes"] == 1  # the default keeps DDP on one node when it fits
    assert seen["SPREAD"]["nodes"] == 2 and seen["STRICT_SPREAD"]["nodes"] == 2
    # shutdown() returns once the cluster shows the workers' CPUs free again
    assert all(s["cpus_after_shutdown"] == 6 for s in seen.values()), seen


def test_shutdown_returns_with_the_cpus_free(trainer_factory):
    import ray

    trainer = trainer_factory(num_workers=3)
    trainer.shutdown()
    assert ray.available_resources().get("CPU") == 4
