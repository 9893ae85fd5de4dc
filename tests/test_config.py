import pytest

from raysgd.config import BatchSplit, WorkerSettings, check_num_workers, resolve_backend
from raysgd.driver.failures import primary_failure
from raysgd.errors import ConfigError, RankFailure, WorkerFailedError
from raysgd.worker.distributed import local_ranks


@pytest.mark.parametrize("kwargs, fragment", [
    ({"scheduler_step_freq": "hourly"}, "scheduler_step_freq"),
    ({"use_fp16": "fp8"}, "use_fp16"),
    ({"use_fp16": 1}, "use_fp16"),
    ({"use_fp16": "apex"}, "Native torch.amp"),
    ({"backend": "mpi"}, "backend"),
    ({"backend": "nccl"}, "needs GPUs"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"num_cpus_per_worker": -1}, "num_cpus_per_worker"),
    ({"apex_args": [1]}, "apex_args"),
])
def test_invalid_settings_are_rejected_with_the_fix(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        WorkerSettings(**kwargs)


def test_valid_settings():
    for mode in (False, True, "bf16"):
        assert WorkerSettings(use_fp16=mode).use_fp16 == mode
    for freq in ("batch", "epoch", "manual", None):
        WorkerSettings(scheduler_step_freq=freq)


def test_backend_resolution_and_num_workers():
    assert resolve_backend("auto", False) == "gloo"
    assert resolve_backend("auto", True) == "nccl"
    with pytest.raises(ConfigError):
        resolve_backend("tcp", False)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="num_workers"):
            check_num_workers(bad)


def test_batch_split():
    split = BatchSplit(1024, 3)
    assert split.per_worker == 341 and not split.divides and split.effective_global == 1023
    assert BatchSplit(64, 2).divides
    with pytest.raises(ConfigError, match="smaller than num_workers"):
        BatchSplit(1, 2)
    with pytest.raises(ConfigError, match="positive integer"):
        BatchSplit("64", 2)


def test_local_ranks_count_per_node():
    assert local_ranks(["a", "a", "b", "a", "b"]) == [0, 1, 0, 2, 1]


def test_primary_failure_prefers_user_error_and_groups_deaths():
    import torch.distributed as dist

    user = RankFailure(1, ValueError("bad"), "remote tb")
    collective = RankFailure(0, dist.DistBackendError("peer closed"))
    err = primary_failure([collective, user])
    assert isinstance(err, ValueError)
    assert any("rank 1" in note for note in err.__notes__)
    died = RankFailure(1, RuntimeError("actor died"), died=True)
    err = primary_failure([collective, died])
    assert isinstance(err, WorkerFailedError) and err.ranks == (0, 1)
    assert "worker died" in str(err)


def test_a_gloo_transport_error_from_backward_is_a_peers_loss_not_a_user_error():
    # DDP's reducer raises a peer's death inside backward() as a plain RuntimeError. Taken
    # for a user error, it kept the driver from checking the dead rank's node at once: a
    # lost node cost 2-3 s more before the survivors could stay (bench.chaos, 2026-11-29).
    from raysgd.driver.failures import is_collective_error

    reset = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537]"
                         " Read error [127.0.0.1]:6867: Connection reset by peer.")
    assert is_collective_error(reset)
    assert not is_collective_error(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_collective_error(RuntimeError(  # a mismatched collective: the user's
        "[enforce fail at ../third_party/gloo/gloo/transport/tcp/pair.cc:446] "
        "op.preamble.length <= op.nbytes. 8 vs 4"))
    assert not is_collective_error(ValueError("gloo/transport/ in a user's own message"))
    err = primary_failure([RankFailure(0, reset)])
    assert isinstance(err, WorkerFailedError) and err.ranks == (0,)
    user = primary_failure([RankFailure(0, reset), RankFailure(1, ValueError("bad"))])
    assert isinstance(user, ValueError)  # rank 1's own error, not the reset it caused on 0


def test_nccl_timeout_env_is_the_default_timeout(monkeypatch):
    from raysgd.config import default_timeout_s

    monkeypatch.delenv("NCCL_TIMEOUT_S", raising=False)
    assert default_timeout_s() == 1800.0
    monkeypatch.setenv("NCCL_TIMEOUT_S", "1000")
    assert default_timeout_s() == 1000.0
    monkeypatch.setenv("NCCL_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="NCCL_TIMEOUT_S"):
        default_timeout_s()
