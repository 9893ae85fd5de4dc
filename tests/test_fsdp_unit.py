"""The strategy settings and the chunk arithmetic of sharded states; no Ray, no process group."""
import itertools

import pytest
import torch
from torch import nn

from operators_for_tests import LinearOperator
from raysgd import DDP, FSDP, ConfigError, TorchTrainer
from raysgd.errors import CheckpointError
from raysgd.state.chunks import assemble, make_chunk
from raysgd.state.packing import pack_tensors
from raysgd.strategy import resolve_strategy


def rows(n, parts):
    """torch.chunk's row ranges, as FSDP2 shards dim 0."""
    size = -(-n // parts)
    return [(min(i * size, n), min((i + 1) * size, n)) for i in range(parts)]


@pytest.mark.parametrize("old, new", [(2, 2), (4, 2), (2, 4), (3, 2), (1, 3), (4, 3)])
def test_a_new_piece_is_cut_from_the_overlapping_old_chunks(old, new):
    full = torch.arange(7 * 5, dtype=torch.float32).reshape(7, 5)
    chunks = [make_chunk(full[a:b].clone(), full.shape, (a, 0)) for a, b in rows(7, old)]
    packed = pack_tensors(chunks)  # restores read packed chunks without unpacking them
    for a, b in rows(7, new):
        for sources in (chunks, packed):
            piece = assemble(full.shape, (b - a, 5), (a, 0), sources)
            assert torch.equal(piece, full[a:b])


def test_a_full_tensor_is_one_chunk_at_offset_zero():
    full = torch.randn(6, 3)
    assert torch.equal(assemble(full.shape, (2, 3), (4, 0), [full]), full[4:6])
    scalar = torch.tensor(3.0)
    assert torch.equal(assemble((), (), (), [scalar]), scalar)


def test_the_own_chunk_comes_back_as_a_copy():
    local = torch.ones(3, 2)
    piece = assemble((6, 2), (3, 2), (3, 0), [make_chunk(local, (6, 2), (3, 0))])
    assert torch.equal(piece, local) and piece.data_ptr() != local.data_ptr()


def test_a_missing_shard_or_another_shape_is_a_checkpoint_error():
    full = torch.randn(6, 3)
    with pytest.raises(CheckpointError, match="a shard is missing"):
        assemble(full.shape, (6, 3), (0, 0), [make_chunk(full[:3], full.shape, (0, 0))])
    with pytest.raises(CheckpointError, match=r"shape \(6, 3\) in the checkpoint but \(6, 4\)"):
        assemble((6, 4), (3, 4), (0, 0), [full], name="fc.weight")


def test_strategy_names_and_objects_resolve():
    assert resolve_strategy("ddp", True, False) == DDP()
    assert resolve_strategy(None, True, False) == DDP()
    assert resolve_strategy("fsdp", True, "bf16") == FSDP()
    spec = FSDP(units=(nn.Linear,), reshard_after_forward=False)
    assert resolve_strategy(spec, True, False) is spec


@pytest.mark.parametrize("kwargs, message", [
    ({"units": "Linear"}, "takes a torch.nn.Module subclass"),
    ({"units": (nn.Linear, int)}, r"not torch.nn.Module subclasses: \['int'\]"),
    ({"reshard_after_forward": 1}, "must be True or False"),
    ({"cpu_offload": "yes"}, "must be True or False"),
    ({"reduce_dtype": "bf16"}, "must be a torch.dtype"),
    ({"init_weights": 3}, "function of one module"),
])
def test_bad_fsdp_settings_say_what_to_pass(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        FSDP(**kwargs)


class NoGroup:
    """A worker group that must never be built: the checks come first."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("a worker group was built before the input was checked")

    @staticmethod
    def cluster_gpus():
        return 0.0


@pytest.mark.parametrize("kwargs, message", [
    ({"strategy": FSDP(), "wrap_ddp": False}, "drop wrap_ddp=False"),
    ({"strategy": "zero3"}, "is not a strategy; pass 'ddp'"),
    ({"strategy": nn.Linear}, "is not a strategy"),
])
def test_bad_strategy_input_fails_on_the_driver_before_any_worker(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TorchTrainer(LinearOperator, num_workers=2, use_gpu=False,
                     _worker_group_cls=NoGroup, **kwargs)


def test_operators_that_cannot_shard_say_why():
    pl = pytest.importorskip("pytorch_lightning")

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(2, 1)

    from raysgd import TrainingOperator
    operator = TrainingOperator.from_ptl(Tiny)
    with pytest.raises(ConfigError, match="LightningModule's gradient averaging"):
        TorchTrainer(operator, num_workers=2, use_gpu=False, strategy=FSDP(),
                     _worker_group_cls=NoGroup)


def test_every_row_is_covered_exactly_once_for_small_tensors():
    """Tensors with fewer rows than ranks: some ranks hold empty chunks."""
    full = torch.randn(1, 4)
    for old, new in itertools.product((1, 2, 3), repeat=2):
        chunks = [make_chunk(full[a:b].clone(), full.shape, (a, 0)) for a, b in rows(1, old)]
        for a, b in rows(1, new):
            assert torch.equal(assemble(full.shape, (b - a, 4), (a, 0), chunks), full[a:b])


def test_fsdp_in_the_driver_at_world_size_one_matches_ddp_and_cleans_up():
    """use_local=True, num_workers=1: no Ray; FSDP shards over a world of one."""
    import torch.distributed as dist

    from fsdp_operators import Block, StackOperator
    from raysgd.utils import BATCH_SIZE

    got = {}
    for name, strategy in (("ddp", "ddp"), ("fsdp", FSDP(units=Block))):
        trainer = TorchTrainer(StackOperator, num_workers=1, use_local=True, use_gpu=False,
                               strategy=strategy, config={BATCH_SIZE: 32})
        try:
            losses = [trainer.train()["train_loss"] for _ in range(2)]
            got[name] = losses, [p.detach().clone() for p in trainer.get_model().parameters()]
            sharded = type(trainer.get_local_operator().model).__name__.startswith("FSDP")
            assert sharded == (name == "fsdp")
        finally:
            trainer.shutdown()
        assert not dist.is_initialized()  # the world of one is torn down with the trainer
    assert got["ddp"][0] == got["fsdp"][0]
    for a, b in zip(got["ddp"][1], got["fsdp"][1]):
        assert torch.equal(a, b)


def test_each_set_up_shards_on_a_mesh_of_its_own():
    """A pooled process may hold another rank of an equal-sized mesh in its next trainer;
    DTensor caches sharding decisions by mesh (equal meshes share them, with the old mesh's
    coordinate), so every set-up's mesh must compare unequal to the ones before."""
    from fsdp_operators import Block, StackOperator
    from raysgd.utils import BATCH_SIZE

    meshes = []
    for _ in range(2):
        trainer = TorchTrainer(StackOperator, num_workers=1, use_local=True, use_gpu=False,
                               strategy=FSDP(units=Block), config={BATCH_SIZE: 32})
        try:
            model = trainer.get_local_operator().model
            meshes.append(next(model.parameters()).device_mesh)
        finally:
            trainer.shutdown()
    assert meshes[0].size() == meshes[1].size() and meshes[0] != meshes[1]
