"""Between-call commits in the driver's slabs (raysgd.driver.slabs), with a real Ray and real
process groups: a state of about 35 MB per rank, above the size that uses them."""
import json
import os
import signal

import pytest
import torch

from operators_for_tests import DyingWideOperator, WideOperator
from raysgd.state import checkpoint as checkpoint_io
from raysgd.utils import BATCH_SIZE

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="Linux only")
CONFIG = {BATCH_SIZE: 32, "data_size": 128}


def _weights(trainer) -> dict:
    return {k: v.clone() for k, v in trainer.get_model().state_dict().items()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _fail_next_step_on(trainer, ranks) -> None:
    def arm(op):
        op.fail_step, op.fail_ranks = op.global_step + 1, ranks

    trainer.apply_all_operators(arm)


def test_a_user_error_rolls_back_to_the_slab_commit_bitwise(trainer_factory):
    trainer = trainer_factory(WideOperator, config=CONFIG)
    trainer.train()
    assert trainer._supervisor.commit.slab_versions  # the call-end commit's slab
    _fail_next_step_on(trainer, (1,))  # rank 0 waits in the all-reduce: the group restarts
    before = _weights(trainer)
    with pytest.raises(KeyError, match="missing-key"):
        trainer.train()
    assert _same(_weights(trainer), before)
    assert trainer.recovery_stats.user_errors == 1
    trainer.apply_all_operators(lambda op: setattr(op, "fail_ranks", ()))
    trainer.train()  # the slab of the commit restored is not the one the next commit takes
    assert trainer._supervisor.commit.slab_versions


def test_in_epoch_commits_go_to_slabs_and_a_user_error_rolls_back_to_one_bitwise(
        trainer_factory):
    clean = trainer_factory(WideOperator, config=CONFIG, checkpoint_every_n_steps=2)
    clean.train(num_steps=4)
    expected = _weights(clean)
    clean.shutdown()
    trainer = trainer_factory(WideOperator, config=CONFIG, checkpoint_every_n_steps=2)

    def arm(op):  # rank 1 raises in the step after the in-epoch commit of step 4 landed
        op.fail_step, op.fail_ranks = 5, (1,)

    trainer.apply_all_operators(arm)
    with pytest.raises(KeyError, match="missing-key"):
        trainer.train(num_steps=6)
    commit = trainer._supervisor.commit
    assert commit.step == 4 and commit.call_done  # an in-epoch commit...
    assert commit.slab_versions and commit.slab_ranks == (0,)  # ...in rank 0's slab
    assert _same(_weights(trainer), expected)


@pytest.mark.slow
def test_a_newcomer_restores_a_slab_commit_and_the_run_ends_as_an_unfaulted_one(
        trainer_factory, tmp_path):
    clean = trainer_factory(WideOperator, config=CONFIG)
    for _ in range(2):
        clean.train()
    expected = _weights(clean)
    clean.shutdown()
    faulted = trainer_factory(WideOperator, config={**CONFIG, "pid_dir": str(tmp_path)})
    faulted.train()
    with open(tmp_path / "rank0") as handle:
        os.kill(int(handle.read()), signal.SIGKILL)  # the rank that wrote the slab
    faulted.train()
    assert faulted.recovery_stats.failures == 1
    assert _same(_weights(faulted), expected)


@pytest.mark.slow
def test_a_survivor_gets_a_slab_again_after_a_newcomer_took_a_dead_ranks_place(
        trainer_factory, tmp_path):
    """Issue 70's third risk: the survivor keeps its process but gets a new runner, which
    holds no slab; the driver must name it one again, or its commits all go to Ray's store
    (the memory that grew with every failure). Commits at call ends only: the slab each
    call's request names is the one its call-end commit must use."""
    trainer = trainer_factory(WideOperator, config={**CONFIG, "pid_dir": str(tmp_path)},
                              checkpoint_every_n_steps=None)
    trainer.train()
    with open(tmp_path / "rank1") as handle:
        os.kill(int(handle.read()), signal.SIGKILL)  # rank 0 survives with the full state
    trainer.train()
    assert trainer.recovery_stats.failures == 1
    trainer.train()
    assert trainer._supervisor.commit.slab_ranks == (0,), trainer._supervisor.commit


@pytest.mark.slow
def test_the_survivors_hand_over_goes_to_a_slab_not_to_rays_store(trainer_factory):
    """A rank killed mid-call: the survivor's live state becomes the commit. It is written
    to the survivor's slab like any commit; a new object in Ray's store per failure is
    memory the store keeps."""
    trainer = trainer_factory(DyingWideOperator, config={**CONFIG, "data_size": 256},
                              checkpoint_every_n_steps=None)
    trainer.train()
    group = trainer._supervisor.group
    handed, ask = [], group.survivor_commit
    group.survivor_commit = lambda *args: handed.append(ask(*args)) or handed[-1]

    def arm(op):
        op.die_step = op.global_step + 2

    trainer.apply_all_operators(arm)
    trainer.train()
    assert trainer.recovery_stats.failures == 1
    commit, = handed
    assert commit is not None and commit.slab_ranks == (0,) and commit.slab_versions, commit


def test_a_checkpoint_written_from_a_slab_commit_holds_the_trained_state(
        trainer_factory, tmp_path):
    trainer = trainer_factory(WideOperator, config=CONFIG, checkpoint_dir=str(tmp_path))
    for _ in range(3):
        trainer.train()
    weights = _weights(trainer)
    trainer.shutdown()  # waits for the last checkpoint
    index = json.loads((tmp_path / "index.json").read_text())
    saved = checkpoint_io.read(str(tmp_path / index["latest"]))
    assert _same(saved["models"][0], weights)


def test_a_rank_off_the_drivers_node_reads_copies_of_the_slab_snapshots_only(ray_session):
    from raysgd.driver.slabs import CommitSlabs, readable_on
    from raysgd.state.commit import Commit
    from raysgd.state.packing import PackedTensor
    from raysgd.state.slab import SlabTarget, SlabTensor, machine_id
    from raysgd.worker.slab_writer import SlabWriter

    slabs, writer = CommitSlabs(), SlabWriter(min_bytes=0)
    target = SlabTarget(os.getpid(), slabs._fd(0, 0), 1, machine=machine_id())
    in_slab = ray_session.put({"state": writer.write(target, {"w": torch.ones(8)})[0]})
    in_store = ray_session.put({"state": {"w": torch.zeros(8)}})
    commit = Commit(0, 0, 2, [in_slab, in_store], slab_versions=(1,), slab_ranks=(0,))
    here = ray_session.get_runtime_context().get_node_id()
    local, remote = readable_on([here, "another-node"], commit)
    assert local == [in_slab, in_store] and remote[1] is in_store
    copied = ray_session.get(remote[0])["state"]["w"]
    assert isinstance(copied, PackedTensor) and not isinstance(copied, SlabTensor)
    assert readable_on(["another-node"], Commit(0, 0, 2, [in_slab, in_store]))[0][0] is in_slab
    writer.close()
    slabs.close()
