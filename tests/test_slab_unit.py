"""Commit slabs without Ray: a rank's writer, the driver's slots, and every reader's check
that the commit it read was not overwritten (raysgd.state.slab)."""
import os
import pickle

import pytest
import torch

from raysgd.driver.slabs import CommitSlabs
from raysgd.errors import CheckpointError, SlabCommitLost
from raysgd.state.commit import Commit, CommitAssembler
from raysgd.state.commit_files import CommitFiles
from raysgd.state.packing import (PackedTensor, own_copies, pack_tensors, unpack_tensors,
                                  verify_packed)
from raysgd.state.slab import SlabTarget, SlabTensor, machine_id
from raysgd.storage.store import LocalStore
from raysgd.worker.slab_writer import SlabWriter

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="Linux only")


def _state(value: float = 0.0):
    return {"model": {"w": torch.full((64, 32), value), "b": torch.arange(5, dtype=torch.bfloat16)},
            "steps": 7, "rng": [torch.tensor([1, 2, 3], dtype=torch.uint8)]}


def _target(slabs: CommitSlabs, version: int, slot: int = 0) -> SlabTarget:
    return SlabTarget(os.getpid(), slabs._fd(0, slot), version, machine=machine_id())


def _leaves(obj):
    if isinstance(obj, dict):
        return [leaf for value in obj.values() for leaf in _leaves(value)]
    if isinstance(obj, (list, tuple)):
        return [leaf for value in obj for leaf in _leaves(value)]
    return [obj]


@pytest.fixture
def slabs():
    made = CommitSlabs()
    yield made
    made.close()


def test_a_commit_in_a_slab_pickles_small_and_reads_back_exactly(slabs):
    writer = SlabWriter(min_bytes=0)
    state = _state(1.5)
    snap = writer.write(_target(slabs, 1), state)[0]
    tensors = [leaf for leaf in _leaves(snap) if isinstance(leaf, SlabTensor)]
    assert len(tensors) == 3 and snap["steps"] == 7
    assert len(pickle.dumps(snap)) < 2000  # a few numbers per tensor, not 8 KB of floats
    back = unpack_tensors(pickle.loads(pickle.dumps(snap)))
    assert torch.equal(back["model"]["w"], state["model"]["w"])
    assert back["model"]["b"].dtype == torch.bfloat16
    assert torch.equal(back["model"]["b"], state["model"]["b"])
    back["model"]["w"] += 1  # a restored tensor is the rank's own, not the slab's bytes
    assert torch.equal(unpack_tensors(snap)["model"]["w"], state["model"]["w"])
    writer.close()


def test_a_commit_whose_slab_was_overwritten_is_refused_by_every_reader(slabs):
    writer = SlabWriter(min_bytes=0)
    old = writer.write(_target(slabs, 1), _state(1.0))[0]
    new = writer.write(_target(slabs, 2), _state(2.0))[0]
    for read in (unpack_tensors, own_copies, verify_packed):
        with pytest.raises(SlabCommitLost, match="version 1 was overwritten"):
            read(old)
    assert float(unpack_tensors(new)["model"]["w"][0, 0]) == 2.0
    writer.close()


def test_a_read_opens_each_slab_once_whatever_its_tensor_count(slabs, monkeypatch):
    writer = SlabWriter(min_bytes=0)
    tensors = {"t": [torch.full((8,), float(i)) for i in range(50)]}
    snap = writer.write(_target(slabs, 1), tensors)[0]
    opened, real_open = [], SlabTensor._open
    monkeypatch.setattr(SlabTensor, "_open", lambda self: opened.append(self) or real_open(self))
    back = unpack_tensors(snap)
    assert [float(t[0]) for t in back["t"]] == [float(i) for i in range(50)]
    assert len(opened) == 2  # one mapping for all 50 tensors, one check after the copies
    writer.close()


def test_small_commits_and_unopenable_slabs_stay_for_rays_store(slabs, caplog):
    small = SlabWriter().write(_target(slabs, 1), _state())[0]  # far below SLAB_MIN_BYTES
    assert all(isinstance(leaf, PackedTensor) for leaf in _leaves(small["model"]))
    gone = SlabTarget(os.getpid(), 10_000, 1, machine=machine_id())  # no such descriptor
    packed = SlabWriter(min_bytes=0).write(gone, _state())[0]
    assert isinstance(packed["model"]["w"], PackedTensor)
    assert "commits go to Ray's object store instead" in caplog.text


def test_a_descriptor_that_is_no_slab_or_another_machines_is_never_written(slabs, tmp_path):
    with open(tmp_path / "precious", "wb+") as handle:
        handle.write(b"keep me")
        handle.flush()
        other_file = SlabTarget(os.getpid(), handle.fileno(), 1, machine=machine_id())
        packed = SlabWriter(min_bytes=0).write(other_file, _state())[0]
        assert isinstance(packed["model"]["w"], PackedTensor)
    assert (tmp_path / "precious").read_bytes() == b"keep me"
    elsewhere = SlabTarget(os.getpid(), slabs._fd(0, 0), 1, machine="another-boot-id")
    assert isinstance(SlabWriter(min_bytes=0).write(elsewhere, _state())[0]["model"]["w"],
                      PackedTensor)
    assert os.fstat(slabs._fd(0, 0)).st_size == 0


def test_two_slots_never_overwrite_a_commit_the_driver_holds(slabs):
    nodes = ["n1", "n1", "n2"]
    first = slabs.targets(nodes, [], here="n1")
    assert first[2] is None and first[0].fd != first[1].fd  # a slab per rank on the node
    assert first[0].version != first[1].version  # every named slab has a version of its own
    for rank in (0, 1):
        slabs.consumed(rank, first[rank].version)
    held = Commit(0, 0, 3, slab_versions=(first[0].version, first[1].version), slab_ranks=(0, 1))
    second = slabs.targets(nodes, [held, None], here="n1")
    assert second[0].fd not in (first[0].fd,) and second[1].fd != first[1].fd  # the other slot
    for rank in (0, 1):
        slabs.consumed(rank, second[rank].version)
    both = Commit(0, 0, 3, slab_versions=(second[0].version, second[1].version))
    assert slabs.targets(nodes, [held, both], here="n1") == [None] * 3
    # a commit in Ray's store (no slab versions) holds no slot
    third = slabs.targets(nodes, [both, Commit(0, 0, 3)], here="n1")
    assert third[0].fd == first[0].fd
    assert slabs.targets(["n2"], [], here="n1") == [None]  # no rank on the driver's node


def test_a_rank_keeps_its_named_slab_until_its_commit_uses_it_up(slabs):
    nodes = ["n1", "n1"]
    named = slabs.targets(nodes, [], here="n1", processes=["a", "b"])
    # named again before any commit used it: the rank keeps the one it has
    assert slabs.targets(nodes, [], here="n1", processes=["a", "b"]) == [None, None]
    slabs.consumed(0, named[0].version + 100)  # another version: not the one named
    assert slabs.targets(nodes, [], here="n1", processes=["a", "b"], ranks=[0]) == [None, None]
    slabs.consumed(0, named[0].version)
    again = slabs.targets(nodes, [], here="n1", processes=["a", "b"], ranks=[0])
    assert again[1] is None and again[0] is not None
    # a new process in rank 1's place has no slab named: it gets one
    fresh = slabs.targets(nodes, [], here="n1", processes=["a", "c"])
    assert fresh[0] is None and fresh[1] is not None
    slabs.forget()  # a new group: every runner is new
    assert all(slabs.targets(nodes, [], here="n1", processes=["a", "c"]))


def test_the_parts_of_a_commit_being_assembled_keep_their_slots(slabs):
    named = slabs.targets(["n1"], [], here="n1")[0]
    slabs.consumed(0, named.version)  # its part arrived; the other ranks' have not
    other = slabs.targets(["n1"], [], here="n1", needed=[named.version])[0]
    assert other.fd != named.fd
    slabs.consumed(0, other.version)
    assert slabs.targets(["n1"], [], here="n1", needed=[named.version, other.version]) == [None]


def test_a_named_slab_waits_on_the_writer_for_a_commit_large_enough(slabs):
    writer = SlabWriter(min_bytes=1024)
    writer.offer(_target(slabs, 4))
    small, version, wrote = writer.write_pending(pack_tensors({"w": torch.zeros(4)}))
    assert (version, wrote) == (None, False)  # a small part leaves the slab named
    writer.offer(None)  # a request naming none keeps it
    big, version, wrote = writer.write_pending(pack_tensors(_state(2.0)))
    assert (version, wrote) == (4, True)
    assert float(unpack_tensors(big)["model"]["w"][0, 0]) == 2.0
    _, version, wrote = writer.write_pending(pack_tensors(_state(3.0)))
    assert (version, wrote) == (None, False)  # used up: the next one goes to Ray's store
    writer.close()


def test_closing_frees_the_slabs_and_a_reused_descriptor_is_told_apart(slabs):
    writer = SlabWriter(min_bytes=0)
    snap = writer.write(_target(slabs, 1), _state(1.0))[0]
    path = _target(slabs, 1).path
    slabs.close()
    assert not os.path.exists(path)
    with pytest.raises(SlabCommitLost, match="cannot be opened"):
        unpack_tensors(snap)
    again = CommitSlabs()  # a new trainer: likely the same descriptor number, a new file
    snap2 = writer.write(_target(again, 5), _state(3.0))[0]
    assert float(unpack_tensors(snap2)["model"]["w"][0, 0]) == 3.0
    writer.close()
    again.close()


def test_the_disk_writer_never_places_a_checkpoint_read_from_an_overwritten_slab(
        slabs, tmp_path, monkeypatch):
    from raysgd.state import commit_files

    writer = SlabWriter(min_bytes=0)
    snap = writer.write(_target(slabs, 1), _state(1.0))[0]
    store = LocalStore(str(tmp_path))
    real_save = commit_files.checkpoint_io.save_file

    def save_while_overwritten(path, state):
        writer.write(_target(slabs, 2), _state(2.0))  # a newer commit lands mid-write
        real_save(path, state)

    monkeypatch.setattr(commit_files.checkpoint_io, "save_file", save_while_overwritten)
    files = CommitFiles(lambda refs: [{"step": 3, "call_done": 0, "world_size": 1,
                                       "state": snap, "meters": None}])
    with pytest.raises(CheckpointError, match="overwritten"):
        files.content(Commit(3, 0, 1, [object()], slab_versions=(1,)), {"step": 3}, store)
    staging = store.staging_dir()
    assert not [name for name in os.listdir(staging) if name.startswith(".tmp-")]
    writer.close()


def test_a_slab_that_failed_to_grow_is_mapped_again_not_written_dead(slabs, monkeypatch):
    writer = SlabWriter(min_bytes=0)
    writer.write(_target(slabs, 1), _state(1.0))
    real = os.posix_fallocate

    def no_memory(fd, offset, size):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(os, "posix_fallocate", no_memory)
    bigger = {**_state(2.0), "extra": torch.zeros(4096)}
    packed, wrote = writer.write(_target(slabs, 2), bigger)
    assert isinstance(packed["extra"], PackedTensor) and not wrote
    monkeypatch.setattr(os, "posix_fallocate", real)
    snap, wrote = writer.write(_target(slabs, 3), _state(3.0))  # no larger than before
    assert wrote and float(unpack_tensors(snap)["model"]["w"][0, 0]) == 3.0
    writer.close()


def test_a_rank_whose_slots_are_both_needed_is_asked_once_the_commit_being_assembled_forms(
        slabs):
    """Rank 0 (in slot A's commit) hands its next part to slot B before rank 1's part of that
    step arrives: neither slot is free, so asking it now would send its next commits to Ray's
    store. It is asked once the commit forms, and then gets slot A back."""
    from raysgd.driver.watch import waits_for_a_slot

    nodes, assembler = ["n1", "n2"], CommitAssembler(2, 0)
    first = slabs.targets(nodes, [], here="n1")[0]
    slabs.consumed(0, first.version)
    held = assembler.add(0, 4, 4, "a4", header={"slab_version": first.version, "in_slab": True})
    assert held is None
    held = assembler.add(1, 4, 4, "b4")
    second = slabs.targets(nodes, [held], here="n1", needed=assembler.in_slabs())[0]
    assert second.fd != first.fd
    slabs.consumed(0, second.version)
    assembler.add(0, 8, 8, "a8", header={"slab_version": second.version, "in_slab": True})
    assert slabs.targets(nodes, [held], here="n1", needed=assembler.in_slabs()) == [None, None]
    assert waits_for_a_slot(slabs.full, assembler.waiting()) == {0}  # not asked yet
    formed = assembler.add(1, 8, 8, "b8")
    again = slabs.targets(nodes, [formed], here="n1", needed=assembler.in_slabs())[0]
    assert again.fd == first.fd  # the commit before is no longer needed: its slot is named
    assert waits_for_a_slot(slabs.full, assembler.waiting()) == set()
    # A rank off the driver's node never waits: it has no slab to wait for.
    assert 1 not in slabs.full
