import os

import pytest
import torch

from raysgd.errors import CheckpointError
from raysgd.state import checkpoint


def test_round_trip_and_atomic_write(tmp_path):
    path = str(tmp_path / "ck.pt")
    state = {"models": [{"w": torch.ones(2)}], "optimizers": [{}], "epoch": 3}
    checkpoint.save(path, state)
    loaded = checkpoint.load(path)
    assert loaded["epoch"] == 3 and torch.equal(loaded["models"][0]["w"], torch.ones(2))
    assert os.listdir(tmp_path) == ["ck.pt"]  # no temp file left behind


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    path = str(tmp_path / "ck.pt")
    checkpoint.save(path, {"models": [], "optimizers": [], "epoch": 1})

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        checkpoint.save(path, {"models": [], "optimizers": [], "epoch": 2})
    monkeypatch.undo()
    assert checkpoint.load(path)["epoch"] == 1
    assert os.listdir(tmp_path) == ["ck.pt"]


def test_truncated_foreign_and_missing_files(tmp_path):
    good = tmp_path / "good.pt"
    checkpoint.save(str(good), {"models": [{"w": torch.ones(100)}], "optimizers": [{}]})
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated"):
        checkpoint.load(str(truncated))
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.ones(1)}, foreign)
    with pytest.raises(CheckpointError, match="not a raysgd checkpoint"):
        checkpoint.load(str(foreign))
    text = tmp_path / "text.pt"
    text.write_text("hello")
    with pytest.raises(CheckpointError):
        checkpoint.load(str(text))
    with pytest.raises(CheckpointError, match="No checkpoint"):
        checkpoint.load(str(tmp_path / "absent.pt"))


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_load_never_executes_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"models": [Evil()], "optimizers": []}, path)
    with pytest.raises(CheckpointError):
        checkpoint.load(str(path))


def test_save_refuses_state_that_load_would_refuse(tmp_path):
    import numpy as np

    with pytest.raises(CheckpointError, match="state to save"):
        checkpoint.save(str(tmp_path / "np.pt"), {"models": [], "optimizers": [],
                                                  "operator": {"arr": np.ones(3)}})
    assert not (tmp_path / "np.pt").exists()


def test_the_writers_files_skip_crc_and_still_load(tmp_path):
    import zipfile

    path = str(tmp_path / "ck.pt")
    checkpoint.save_file(path, {"models": [{"w": torch.arange(4.0)}], "optimizers": [{}]})
    assert torch.equal(checkpoint.load(path)["models"][0]["w"], torch.arange(4.0))
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is not None  # no CRC32 written: zip tools notice, torch does not
    assert torch.serialization.get_crc32_options() is True  # the process-wide option restored


def test_the_commit_file_views_the_snapshots_and_is_linked_into_place(tmp_path):
    import numpy as np

    from raysgd.state.commit import Commit
    from raysgd.state.commit_files import CommitFiles, to_checkpoint
    from raysgd.state.packing import pack_tensors
    from raysgd.storage.store import LocalStore

    weight = torch.arange(6.0)
    snaps = [{"state": pack_tensors({"models": [{"w": weight}], "optimizers": [{}]})},
             {"state": pack_tensors({"rng": torch.ones(3)})}]
    viewed = to_checkpoint(snaps, {"step": 1})["models"][0]["w"]
    assert viewed.data_ptr() == snaps[0]["state"]["models"][0]["w"].data.ctypes.data  # no copy
    assert isinstance(snaps[0]["state"]["models"][0]["w"].data, np.ndarray)
    source, store = CommitFiles(lambda refs: refs), LocalStore(str(tmp_path / "run"))
    staged = source.content(Commit(1, 0, 2, snaps), {"step": 1}, store)
    assert os.path.dirname(staged) == store.root and os.path.basename(staged).startswith(".tmp-")
    store.write("checkpoint-000001.pt", staged)
    placed = os.path.join(store.root, "checkpoint-000001.pt")
    assert os.stat(placed).st_ino == os.stat(staged).st_ino  # a link, not a second copy
    source.release(staged)
    assert os.listdir(store.root) == ["checkpoint-000001.pt"]
    loaded = checkpoint.load(placed)
    assert torch.equal(loaded["models"][0]["w"], weight) and loaded["raysgd_run"] == {"step": 1}
    assert torch.equal(loaded["ranks"][0]["rng"], torch.ones(3))
