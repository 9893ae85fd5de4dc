import math

import pytest
import torch

from raysgd.worker.metrics import AverageMeter, AverageMeterCollection, reduce_worker_results
from raysgd.worker.timers import NULL_TIMERS, TimerCollection


def test_average_meter_weights_by_n():
    meter = AverageMeter()
    assert (meter.avg, meter.val, meter.sum, meter.count) == (0.0, 0.0, 0.0, 0)  # as legacy's
    meter.update(1.0, n=1)
    meter.update(4.0, n=3)
    assert meter.avg == pytest.approx(13 / 4)
    assert meter.val == 4.0


def test_tensor_losses_are_summed_where_they_live_and_read_only_by_the_summary():
    # A meta tensor cannot be read at all: updating with one proves no step reads its loss
    # (on a GPU each read waits for the device).
    meters = AverageMeterCollection()
    for _ in range(3):
        meters.update({"loss": torch.tensor(1.0, device="meta")}, n=4)
    with pytest.raises((RuntimeError, NotImplementedError)):
        meters.summary()
    # bf16 losses are summed in double precision and read as Python floats.
    meters = AverageMeterCollection()
    for value in (1.001, 2.002, 3.003):
        meters.update({"loss": torch.tensor(value, dtype=torch.bfloat16)}, n=1)
    summary = meters.summary()
    expected = sum(float(torch.tensor(v, dtype=torch.bfloat16)) for v in (1.001, 2.002, 3.003))
    assert type(summary["loss"]) is float and summary["loss"] == pytest.approx(expected / 3)
    assert type(summary["last_loss"]) is float


def test_meters_copied_into_a_commit_hold_numbers_not_device_tensors():
    import copy
    import pickle

    meters = AverageMeterCollection()
    meters.update({"loss": torch.tensor(2.0), "correct": torch.tensor(5)}, n=2)
    for copied in (copy.deepcopy(meters), pickle.loads(pickle.dumps(meters))):
        held = [value for meter in copied._meters.values() for value in vars(meter).values()]
        assert not any(isinstance(value, torch.Tensor) for value in held)
        assert copied.summary() == meters.summary()
        copied.update({"loss": torch.tensor(4.0), "correct": torch.tensor(1)}, n=2)
        assert copied.summary()["loss"] == 3.0
    summary = meters.summary()
    assert summary["last_correct"] == 5 and type(summary["last_correct"]) is int


def test_a_meter_keeps_its_own_copy_of_a_tensor_value():
    meter = AverageMeter()
    value = torch.tensor(1.0, dtype=torch.float64)
    meter.update(value)
    value.add_(10)  # the caller reuses its tensor
    assert meter.val == 1.0 and meter.avg == 1.0


def test_collection_summary_has_counts_and_last_values():
    meters = AverageMeterCollection()
    meters.update({"loss": torch.tensor(2.0), "name": "x"}, n=2)
    meters.update({"loss": 5.0}, n=1)
    summary = meters.summary()
    assert summary == {"batch_count": 2, "num_samples": 3, "loss": 3.0, "last_loss": 5.0,
                       "name": "x"}


def test_reduce_weights_by_worker_samples_for_uneven_shards():
    results = [
        {"epoch": 1, "num_samples": 10, "batch_count": 1, "loss": 0.0, "tag": "r0"},
        {"epoch": 1, "num_samples": 30, "batch_count": 3, "loss": 1.0, "tag": "r1"},
    ]
    out = reduce_worker_results(results)
    assert out["num_samples"] == 40
    assert out["loss"] == pytest.approx(0.75)  # legacy unweighted mean would say 0.5
    assert out["batch_count"] == pytest.approx(2.5)
    assert out["epoch"] == 1 and isinstance(out["epoch"], int)
    assert out["tag"] == "r0"


def test_reduce_propagates_nan():
    out = reduce_worker_results([{"num_samples": 5, "loss": 1.0},
                                 {"num_samples": 5, "loss": float("nan")}])
    assert math.isnan(out["loss"])
    out = reduce_worker_results([{"num_samples": 5, "loss": float("nan")},
                                 {"num_samples": 5, "loss": float("nan")}])
    assert math.isnan(out["loss"])


def test_reduce_nested_profile_and_zero_samples():
    out = reduce_worker_results([{"num_samples": 0, "x": 1.0, "profile": {"t": 1.0}},
                                 {"num_samples": 0, "x": 3.0, "profile": {"t": 3.0}}])
    assert out["x"] == 2.0 and out["profile"]["t"] == 2.0
    assert reduce_worker_results([]) == {}


def test_timers_record_means_and_null_timers_cost_nothing():
    timers = TimerCollection()
    for _ in range(2):
        with timers.record("fwd"):
            pass
    stats = timers.stats()
    assert set(stats) == {"mean_fwd_s"} and stats["mean_fwd_s"] >= 0
    assert NULL_TIMERS.record("fwd") is NULL_TIMERS.record("grad")
    assert NULL_TIMERS.stats() == {}


def test_keys_missing_on_rank_0_still_reduce():
    out = reduce_worker_results([{"epoch": 1, "batch_count": 0, "num_samples": 0},
                                 {"epoch": 1, "batch_count": 2, "num_samples": 10, "train_loss": 1.0}])
    assert out["train_loss"] == 1.0 and out["num_samples"] == 10


def test_pretty_print_flattens_profile_and_formats_numbers():
    from raysgd.utils import pretty_print

    text = pretty_print({"epoch": 3, "train_loss": 0.123456789, "tag": "a",
                         "profile": {"mean_fwd_s": 0.00123, "train_epoch_s": 2.5}})
    lines = text.splitlines()
    assert lines[0].split() == ["metric", "value"]
    rows = {line.split()[0]: line.split()[1] for line in lines[2:]}
    assert rows == {"epoch": "3", "train_loss": "0.123457", "tag": "a",
                    "profile.mean_fwd_s": "0.00123", "profile.train_epoch_s": "2.5"}
