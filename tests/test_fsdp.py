"""strategy=FSDP(...) on a real Ray with real gloo process groups (issue 24).

Sharded training against DDP on the same data, sharded commits (what each rank puts, what
the driver holds), the unsharded save() format both ways, resharding at another world size,
DCP disk checkpoints resumed at another size, a meta-device model, and SIGKILLed ranks
recovered bitwise (slow). A SIGKILLed driver's resume from DCP checkpoints: test_run_dir.
"""
import json
import os

import numpy as np
import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from fsdp_operators import Block, StackOperator, stack
from cluster_scripts import WAIT_S as CLUSTER_WAIT_S, cluster_result
from operators_for_tests import FaultyOperator
from raysgd import FSDP, TorchTrainer
from raysgd.errors import CheckpointError
from raysgd.state.chunks import is_chunk
from raysgd.state.packing import PackedTensor, leaves
from raysgd.utils import BATCH_SIZE
from test_fault_tolerance import kill_at_step

pytestmark = pytest.mark.timeout(300)


def make(strategy, operator=StackOperator, num_workers=2, **kwargs):
    config = {BATCH_SIZE: 32, **kwargs.pop("config", {})}
    kwargs.setdefault("spare_workers", 0)
    return TorchTrainer(operator, num_workers=num_workers, use_gpu=False, strategy=strategy,
                        config=config, **kwargs)


def weights(trainer):
    return [p.detach().clone() for p in trainer.get_model().parameters()]


def trained_state(strategy, **kwargs):
    """The state_dict of a trainer of ``make`` after two epochs (shut down after)."""
    trainer = make(strategy, **kwargs)
    try:
        trainer.train()
        trainer.train()
        return trainer.state_dict()
    finally:
        trainer.shutdown()


def assert_plain_torch_reads(directory, want, out):
    """``dcp_to_torch_save`` of a checkpoint directory holds ``want``'s model weights."""
    dcp_to_torch_save(str(directory), str(out))
    plain = torch.load(out, weights_only=False)
    for name, value in want["models"][0].items():
        assert torch.equal(plain["models"][f"0.{name}"], value), name


def assert_same_state(got, want, parts=("models", "optimizers")):
    for part in parts:
        pairs = list(zip(_tensors(got[part]), _tensors(want[part])))
        assert pairs and all(torch.equal(a, b) for a, b in pairs), part


def run(trainer, epochs=2):
    try:
        losses = [trainer.train()["train_loss"] for _ in range(epochs)]
        return losses, weights(trainer), trainer.state_dict()
    finally:
        trainer.shutdown()


@pytest.fixture(scope="module")
def plain_fsdp(ray_session):
    """Two epochs of StackOperator under FSDP(units=Block): (losses, weights, state_dict)."""
    return run(make(FSDP(units=Block)))


@pytest.mark.parametrize("options", [{}, {"accumulate_steps": 2, "clip_grad_norm": 0.05}],
                         ids=["plain", "accumulate+clip"])
def test_fsdp_reaches_the_weights_ddp_reaches(ray_cpus, plain_fsdp, options):
    """fp32, same data and seeds: equal to 1e-6 (measured: bitwise here; reduce-scatter and
    all-reduce may round differently elsewhere)."""
    ddp_losses, ddp_weights, ddp_state = run(make("ddp", **options))
    fsdp_losses, fsdp_weights, fsdp_state = \
        run(make(FSDP(units=Block), **options)) if options else plain_fsdp
    assert np.allclose(ddp_losses, fsdp_losses, rtol=1e-6, atol=1e-7)
    for got, want in zip(fsdp_weights, ddp_weights):
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-7)
    # The unsharded state has DDP's format: index-keyed optimizer state, the same keys.
    assert fsdp_state["models"][0].keys() == ddp_state["models"][0].keys()
    assert fsdp_state["optimizers"][0]["state"].keys() == ddp_state["optimizers"][0]["state"].keys()
    assert fsdp_state["optimizers"][0]["param_groups"][0]["params"] == \
        ddp_state["optimizers"][0]["param_groups"][0]["params"]


def _chunks(obj):
    return leaves(obj, is_chunk)


def _tensors(obj):
    return leaves(obj, torch.Tensor)


def _packed_bytes(obj):
    return sum(packed.data.nbytes
               for packed in leaves(obj, PackedTensor))


def check_commit_holds_shards_only(trainer, num_workers):
    """Each rank's snapshot holds about state/N bytes of chunks and no full models; the
    driver holds references only; the chunks add up to one copy of the state."""
    import ray

    full = trainer.state_dict()
    state_bytes = sum(t.numel() * t.element_size() for part in ("models", "optimizers")
                      for t in _tensors(full[part]))
    commit = trainer._supervisor.commit
    assert all(isinstance(ref, ray.ObjectRef) for ref in commit.snapshots)
    snapshots = ray.get(commit.snapshots)
    for rank, snap in enumerate(snapshots):
        shards = snap["state"]["shards"]
        assert "models" not in snap["state"]  # no rank holds the full models in a commit
        put = _packed_bytes(shards)
        assert put <= state_bytes / num_workers * 1.15 + 4096, (rank, put, state_bytes)
        rows = [(c["data"].shape[0], c["shape"][0]) for c in _chunks(shards)]
        assert rows and all(have <= -(-total // num_workers) for have, total in rows)
    total = sum(_packed_bytes(s["state"]["shards"]) for s in snapshots)
    assert total <= state_bytes * 1.1 + 4096


def test_a_commit_holds_each_ranks_shards_only(ray_cpus):
    """At 2 workers here; at 4 in the resharding test below."""
    trainer = make(FSDP(units=Block), config={"width": 64})
    try:
        trainer.train()
        check_commit_holds_shards_only(trainer, 2)
    finally:
        trainer.shutdown()


def test_fsdp_save_loads_into_ddp_and_into_a_plain_module(ray_cpus, tmp_path):
    fsdp = make(FSDP(units=Block))
    try:
        fsdp.train()
        path = fsdp.save(str(tmp_path / "fsdp.pt"))
        want = weights(fsdp)
    finally:
        fsdp.shutdown()
    plain = stack(16, 3)
    plain.load_state_dict(torch.load(path, weights_only=True)["models"][0])
    for got, ref in zip(plain.parameters(), want):
        assert torch.equal(got.detach(), ref)
    ddp = make("ddp")
    try:
        ddp.load(path)
        for got, ref in zip(weights(ddp), want):
            assert torch.equal(got, ref)
        ddp.train()  # the optimizer state loaded too
        ddp_path = ddp.save(str(tmp_path / "ddp.pt"))
    finally:
        ddp.shutdown()
    back = make(FSDP())  # and a DDP checkpoint loads into FSDP (one unit per model)
    try:
        back.load(ddp_path)
        want = torch.load(ddp_path, weights_only=True)["models"][0]
        for (name, got) in back.get_model().state_dict().items():
            assert torch.equal(got, want[name]), name
    finally:
        back.shutdown()


def test_a_commit_reshards_to_another_world_size_and_back(ray_cpus):
    """4 → 2 → 4 workers: each new rank cuts its rows from the old shards."""
    trainer = make(FSDP(units=Block), num_workers=4, config={"width": 64})
    try:
        trainer.train()
        check_commit_holds_shards_only(trainer, 4)
        want = trainer.state_dict()
        commit = trainer._supervisor.commit
    finally:
        trainer.shutdown()  # the commit's snapshots stay in the object store (the driver's)
    for count in (2, 4):
        group = trainer._make_group(count, recovering=False)
        try:
            group.start()
            group.restore(commit)
            got = group.execute("state_dict")[0]
            assert_same_state(got, want)
            assert got["global_step"] == want["global_step"]
            group.execute("train_epoch", 2)  # and it trains on from there
            commit = group.snapshot()
            want = group.execute("state_dict")[0]
        finally:
            group.shutdown()


def test_disk_checkpoints_are_dcp_directories_that_resume_at_another_size(ray_cpus, plain_fsdp,
                                                                         tmp_path, caplog):
    """Every rank writes its shards (DCP), the driver gathers the files; writing them does
    not change training (Adam's state is saved before its first step too); plain torch reads
    them, and 3 workers resume from what 2 wrote (an uneven split of 16 rows). A state
    change right after a call (apply_all_operators) stages the same step again while the
    writer fetches it: no write fails."""
    run_dir = tmp_path / "run"
    want = trained_state(FSDP(units=Block), checkpoint_dir=str(run_dir),
                         checkpoint_every_n_steps=2, checkpoint_every_n_steps_to_disk=4,
                         checkpoint_score_attr="train_loss")
    assert_same_state(want, plain_fsdp[2], parts=("optimizers",))  # as without checkpoint_dir
    index = json.loads((run_dir / "index.json").read_text())
    assert [e["step"] for e in index["checkpoints"]] == [8, 12, 16]  # keep_checkpoints=3
    latest = run_dir / index["latest"]
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(latest))
    assert index["best"]["file"] == "best" and (run_dir / "best" / ".metadata").exists()
    assert_plain_torch_reads(latest, want, tmp_path / "plain.pt")

    resumed = make(FSDP(units=Block), num_workers=3, checkpoint_dir=str(run_dir),
                   config={BATCH_SIZE: 48})
    try:
        assert resumed.epoch == 2
        got = resumed.state_dict()
        assert_same_state(got, want)
        assert got["global_step"] == want["global_step"]
        resumed.train()  # and it trains on, writing 3-rank checkpoints
        resumed.apply_all_operators(lambda op: None)  # the same step committed anew, at once
        after = resumed.state_dict()
    finally:
        resumed.shutdown()
    assert "could not write a checkpoint" not in caplog.text
    latest = run_dir / json.loads((run_dir / "index.json").read_text())["latest"]
    assert len([name for name in os.listdir(latest) if name.endswith(".distcp")]) == 3
    with pytest.raises(CheckpointError, match=r"resume with strategy=FSDP"):
        make("ddp", checkpoint_dir=str(run_dir))
    loaded = make(FSDP())  # load() takes such a directory too (one unit per model here)
    try:
        loaded.load(str(latest))
        got = loaded.state_dict()
        assert_same_state(got, after, parts=("models",))
        assert got["global_step"] == after["global_step"] > want["global_step"]
    finally:
        loaded.shutdown()


def test_a_meta_device_model_is_materialized_shard_by_shard(ray_cpus):
    width, depth = 1536, 4  # 38 MB of parameters
    full_bytes = sum(p.numel() * 4 for p in stack(width, depth).parameters())
    trainer = make(FSDP(units=Block), config={"meta": True, "width": width, "depth": depth,
                                              "data_size": 64, "lr": 1e-5})
    try:
        growth = trainer.apply_all_operators(lambda op: op.register_growth)
        assert max(growth) < 0.75 * full_bytes, (growth, full_bytes)  # a half, plus slack
        first = trainer.train()["train_loss"]
        second = trainer.train()["train_loss"]
        assert np.isfinite(first) and second < first
        model = trainer.get_model()
        assert not any(p.is_meta for p in model.parameters())
        assert all(p.abs().sum() > 0 for p in model.parameters() if p.dim() == 2)  # initialised
    finally:
        trainer.shutdown()


def test_bf16_becomes_fsdps_mixed_precision_policy(ray_cpus):
    trainer = make(FSDP(units=Block), use_fp16="bf16")
    try:
        losses = [trainer.train()["train_loss"] for _ in range(2)]
        assert losses[1] < losses[0]
        dtypes = trainer.apply_all_operators(
            lambda op: str(op.model._get_fsdp_state()._mp_policy.param_dtype))
        assert dtypes == ["torch.bfloat16"] * 2
        assert all(p.dtype == torch.float32 for p in trainer.get_model().parameters())
    finally:
        trainer.shutdown()


def fsdp_run(pid_dir, spares, kill, every=3):
    """Three epochs of FaultyOperator under FSDP; rank 1 SIGKILLed mid second epoch if
    ``kill``: (epochs, weights, recovery stats, the interval of the call the kill came in)."""
    os.makedirs(pid_dir, exist_ok=True)
    config = {BATCH_SIZE: 32, "pid_dir": str(pid_dir), "sleep_s": 0.02}
    trainer = TorchTrainer(FaultyOperator, num_workers=2, use_gpu=False,
                           strategy=FSDP(units=nn.Linear), checkpoint_every_n_steps=every,
                           spare_workers=spares, config=config)
    try:
        epochs = [trainer.train()["epoch"]]
        interval = trainer.recovery_stats.commit_interval  # the next call's
        before = trainer.apply_all_workers(os.getpid)
        if kill:
            kill_at_step(pid_dir, 1, 16 + 10)  # mid second epoch (16 steps per epoch)
        epochs += [trainer.train()["epoch"] for _ in range(2)]
        if kill:  # rank 0 kept its process, whether a spare or a new process took rank 1
            assert trainer.apply_all_workers(os.getpid)[0] == before[0]
        return epochs, weights(trainer), trainer.recovery_stats, interval
    finally:
        trainer.shutdown()


@pytest.fixture(scope="module")
def unfaulted(ray_session, tmp_path_factory):
    return fsdp_run(tmp_path_factory.mktemp("ref"), spares=0, kill=False)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("spares, every", [(1, 3), (0, "auto")], ids=["spare", "new-process"])
def test_a_sigkilled_rank_under_fsdp_recovers_bitwise(unfaulted, ray_cpus, tmp_path, spares,
                                                      every):
    """With the default "auto" interval too: a kill redoes at most the interval the call
    ran with, and the step in flight."""
    ref_epochs, ref_weights, *_ = unfaulted
    epochs, got, stats, interval = fsdp_run(tmp_path, spares, kill=True, every=every)
    assert stats.failures == 1 and stats.recoveries == 1 and stats.num_workers == 2
    assert isinstance(interval, int) and (every == "auto" or interval == every)
    assert 0 <= stats.steps_lost <= interval + 1
    assert epochs == ref_epochs
    for a, b in zip(got, ref_weights):
        assert torch.equal(a, b)


@pytest.mark.slow
@pytest.mark.timeout(CLUSTER_WAIT_S + 60)
def test_sharded_commits_are_copied_to_the_other_node_and_survive_its_loss(bench_quick):
    """Two worker nodes and a driver-only head, in its own process (cluster_fsdp.py, a
    background job of the session)."""
    seen = cluster_result(bench_quick, "cluster_fsdp.py")
    assert seen["first"] == 512
    assert seen["copies"] == {"distinct_rank_nodes": True, "each_on_the_other_worker_node": True,
                              "none_on_driver_node": True}, seen["seen"]
    loss = seen["after_loss"]
    assert loss["workers"] == 1 and loss["epoch"] == 2 and loss["finite"]
    assert loss["resizes"] and loss["resizes"][0][:2] == [2, 1]  # resharded 2 → 1
    add = seen["after_add"]
    assert add["workers"] == 2 and add["epoch"] == 3 and add["num_samples"] == 512  # 1 → 2
    assert seen["weights_finite"]
    # A node lost before the newest commit's copy landed: the commit before it was restored.
    lost = seen["lost_commit"]
    assert len(lost["fell_back"]) == 1, lost
    assert lost["workers"] == 1 and lost["epoch"] == 4 and lost["finite"]
    assert lost["more_steps_lost"] >= 4  # at least the lost commit's interval
