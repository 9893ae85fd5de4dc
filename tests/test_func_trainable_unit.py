"""Function trainables' pure parts, without Ray: signatures, the lockstep session, blobs."""
import os
from unittest.mock import patch

import pytest

from raysgd.errors import ConfigError
from raysgd.function.session import (FunctionSession, checkpoint_call, current_session,
                                 distributed_checkpoint, distributed_checkpoint_dir)
from raysgd.state.dirblob import pack_dir, unpack_dir


def keyword_dir(config, *, checkpoint_dir=None):
    return checkpoint_dir


@pytest.mark.parametrize("func, passed", [
    (lambda config, checkpoint_dir=None: checkpoint_dir, "/ckpt"),
    (lambda config: "no dir", "no dir"),
    (lambda config, checkpoint=False: checkpoint, "/ckpt"),  # Ray 0.8's name
    (keyword_dir, "/ckpt")])
def test_accepted_signatures_get_the_directory_when_they_take_it(func, passed):
    assert checkpoint_call(func)({}, "/ckpt") == passed


@pytest.mark.parametrize("func", [lambda: None, lambda a, b, c: None, lambda config, other: None,
                                  lambda config, *, other: None])
def test_refused_signatures_say_what_is_expected(func):
    with pytest.raises(ConfigError, match=r"func\(config\) or func\(config, checkpoint_dir"):
        checkpoint_call(func)


def test_session_runs_the_function_in_lockstep():
    progress = []

    def func(config, checkpoint_dir=None):
        for epoch in range(config["epochs"]):
            progress.append(epoch)
            current_session().report({"epoch": epoch, "dir": checkpoint_dir})

    session = FunctionSession(func, {"epochs": 2}, rank=0, world_size=1, checkpoint_dir="/ckpt")
    first = session.next_result()
    assert first == {"done": False, "metrics": {"epoch": 0, "dir": "/ckpt"}, "checkpoint_dir": None}
    assert progress == [0]  # paused in report() until asked again
    assert session.next_result()["metrics"]["epoch"] == 1
    assert session.next_result()["done"]
    assert session.next_result()["done"]  # stays finished


def test_session_hands_the_functions_error_to_the_caller():
    def func(config):
        raise KeyError("missing")

    session = FunctionSession(func, {}, rank=0, world_size=1)
    with pytest.raises(KeyError, match="missing"):
        session.next_result()


def test_rank_0_checkpoint_travels_with_the_next_report(tmp_path):
    def func(config, checkpoint_dir=None):
        with patch("torch.distributed.get_rank", return_value=config["rank"]):
            with distributed_checkpoint_dir(step=3) as path:
                with open(os.path.join(path, "state"), "w") as handle:
                    handle.write("weights")
        current_session().report({"path": path})

    for rank, kept in ((0, True), (1, False)):
        session = FunctionSession(func, {"rank": rank}, rank=rank, world_size=2)
        result = session.next_result()
        assert (result["checkpoint_dir"] is not None) is kept
        assert os.path.exists(result["metrics"]["path"]) is kept  # others' dirs are deleted
        if kept:
            assert pack_dir(result["checkpoint_dir"]) == {"state": b"weights"}


def test_report_refuses_keyword_style_metrics():
    errors = []

    def func(config):
        try:
            current_session().report(["loss", 1.0])
        except ConfigError as exc:
            errors.append(exc)

    session = FunctionSession(func, {}, rank=0, world_size=1)
    assert session.next_result()["done"]
    assert "dict of metrics" in str(errors[0])


def test_ray_08_distributed_checkpoint_gives_a_file_path():
    with patch("torch.distributed.get_rank", return_value=1):
        with distributed_checkpoint(label=1) as path:
            assert path == os.devnull
    with patch("torch.distributed.get_rank", return_value=0):
        with distributed_checkpoint(label=1) as path:
            assert os.path.basename(path) == "checkpoint"
            assert os.path.isdir(os.path.dirname(path))


def test_dir_blob_round_trip_and_refuses_escapes(tmp_path):
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "a.pt").write_bytes(b"\x00\x01")
    (source / "sub" / "b.txt").write_text("b")
    blob = pack_dir(str(source))
    assert blob == {"a.pt": b"\x00\x01", os.path.join("sub", "b.txt"): b"b"}
    target = unpack_dir(blob, str(tmp_path / "dst"))
    assert pack_dir(target) == blob
    with pytest.raises(ValueError, match="outside"):
        unpack_dir({"../evil": b"x"}, str(tmp_path / "dst2"))



def test_the_session_is_active_only_while_the_function_runs():
    seen = []

    def func(config):
        seen.append(current_session())

    session = FunctionSession(func, {}, rank=0, world_size=1)
    assert session.next_result()["done"]
    assert seen == [session] and current_session() is None
