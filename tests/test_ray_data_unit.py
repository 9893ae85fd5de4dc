"""Ray Data input, pure logic (no Ray): DatasetConfig, input checks, restarting a
pass that cannot be replayed, the legacy Dataset's batches."""
import pytest
import torch

from raysgd import ConfigError, DatasetConfig
from raysgd.data import Dataset as LegacyDataset
from raysgd.data.dataset import LegacyBatch
from raysgd.data.dataset_config import check_dataset, check_datasets
from raysgd.worker.passes import Passes


def test_dataset_config_builds_feature_and_label_tuples():
    batch = {"a": 1, "b": 2, "y": 3}
    assert DatasetConfig(feature_columns=["b", "a"], label_column="y").select(batch) == (2, 1, 3)
    assert DatasetConfig(feature_columns="a", label_column="y").select(batch) == (1, 3)
    assert DatasetConfig(label_column="y").select(batch) == (1, 2, 3)  # the others are features
    assert DatasetConfig(feature_columns=["a"]).select(batch) == (1,)
    assert DatasetConfig().select(batch) is batch
    with pytest.raises(ConfigError, match=r"column\(s\) \['z'\].*have \['a', 'b', 'y'\]"):
        DatasetConfig(feature_columns=["z"], label_column="y").select(batch)


def test_dataset_config_batch_size_precedence():
    assert DatasetConfig(batch_size=7).batch_rows(config_share=16) == 7
    assert DatasetConfig().batch_rows(config_share=16) == 16
    assert DatasetConfig().batch_rows(config_share=None) == 256


@pytest.mark.parametrize("kwargs, match", [
    (dict(feature_columns=[]), "non-empty list"),
    (dict(feature_columns=["a", 3]), "non-empty list"),
    (dict(label_column=3), "column name"),
    (dict(collate_fn=3), "must be callable"),
    (dict(collate_fn=lambda b: b, label_column="y"), "either collate_fn or"),
    (dict(batch_size=0), "batch_size=...\\) must be an int >= 1"),
    (dict(batch_size=True), "batch_size"),
    (dict(prefetch_batches=-1), "prefetch_batches=...\\) must be an int >= 0"),
])
def test_dataset_config_refuses_bad_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DatasetConfig(**kwargs)


def test_inputs_that_are_not_datasets_are_named():
    with pytest.raises(ConfigError, match=r"datasets\['train'\] takes a ray.data.Dataset; got "
                                          r"a builtins.list"):
        check_datasets({"train": [1, 2]})
    with pytest.raises(ConfigError, match="must be a dict"):
        check_datasets([1])
    with pytest.raises(ConfigError, match=r"key\(s\) \['test'\]"):
        check_datasets({"test": None})
    assert check_datasets(None) == {}
    check_dataset("x", LegacyDataset([1]))  # the legacy Dataset is accepted


class Stream:
    """A loader whose order cannot be replayed, like a Ray Data shard."""
    replayable = False

    def __init__(self, n):
        self.n, self.opened = n, 0

    def __iter__(self):
        self.opened += 1
        return iter(range(self.n))


def test_a_stream_restarts_the_interrupted_pass_instead_of_replaying():
    passes = Passes(Stream(5))
    assert list(passes.take(3)) == [0, 1, 2]
    state = passes.state_dict()  # mid pass 1, 3 batches read

    restored = Passes(Stream(5))
    restored.load_state_dict(state)
    assert restored.restarted == {"epoch": 1, "batches": 3}
    assert restored.loader.opened == 0  # nothing replayed
    assert (restored.epoch, restored.completed, restored.steps) == (0, 0, 3)
    # The resumed call (no num_steps) may start the pass again and finishes it.
    assert list(restored.take(None, resume=True)) == [0, 1, 2, 3, 4]
    assert (restored.epoch, restored.completed, restored.restarted) == (1, 1, None)
    assert list(restored.take(None)) == [0, 1, 2, 3, 4] and restored.epoch == 2


def test_a_stream_at_a_pass_boundary_or_a_replayable_loader_is_not_restarted():
    done = Passes(Stream(2))
    list(done.take(None))
    again = Passes(Stream(2))
    again.load_state_dict(done.state_dict())
    assert again.restarted is None and again.completed == 1

    replayable = Passes([10, 11, 12])
    list(replayable.take(2))
    back = Passes([10, 11, 12])
    back.load_state_dict(replayable.state_dict())
    assert back.restarted is None and list(back.take(None, resume=True)) == [12]


def test_a_stream_knows_its_pass_ended_at_its_last_batch():
    passes = Passes(Stream(2))
    assert list(passes.take(2)) == [0, 1]
    assert passes.state_dict()["pass_done"] and passes.completed == 1  # before StopIteration
    again = Passes(Stream(2))
    again.load_state_dict(passes.state_dict())
    assert again.restarted is None and list(again.take(1)) == [0] and again.epoch == 2


def test_restoring_the_position_a_pass_is_at_keeps_it_going():
    passes = Passes(Stream(5))
    list(passes.take(2))
    state = passes.state_dict()
    passes.load_state_dict(state)  # a rollback after a call that read nothing
    assert passes.restarted is None and passes.loader.opened == 1
    assert list(passes.take(None, resume=True)) == [2, 3, 4]


def test_a_new_pass_per_validation_call_never_wraps():
    passes = Passes(Stream(3), "validation loader", allow_empty=True)
    assert list(passes.take_new_pass(2)) == [0, 1]
    assert list(passes.take_new_pass(5)) == [0, 1, 2]  # a new pass, cut at its end
    assert list(passes.take_new_pass(None)) == [0, 1, 2] and passes.loader.opened == 3
    empty = Passes(Stream(0), "validation loader", allow_empty=True)
    assert list(empty.take_new_pass(None)) == [] and empty.loader.opened == 1  # one pass asked


def test_use_loader_keeps_the_counters_and_abandons_the_pass():
    passes = Passes(Stream(4))
    list(passes.take(2))
    passes.use_loader(Stream(3))
    assert (passes.completed, passes.steps) == (1, 2)
    assert list(passes.take(None)) == [0, 1, 2] and passes.epoch == 2


def test_legacy_batches_concatenate_downloaded_items_and_transform_features():
    collate = LegacyBatch(lambda i: (torch.tensor([[float(i)]]), torch.tensor([[i * 2.0]])),
                          transform=lambda x: x + 100)
    features, targets = collate({"item": [1, 2, 3]})
    assert features.tolist() == [[101.0], [102.0], [103.0]]
    assert targets.tolist() == [[2.0], [4.0], [6.0]]
    pairs = LegacyBatch(None, None)({"item": [(torch.ones(1, 2), torch.zeros(1))] * 2})
    assert pairs[0].shape == (2, 2) and pairs[1].shape == (2,)


@pytest.mark.parametrize("kwargs, match", [
    (dict(data=5), "takes a list of items, got int"),
    (dict(data=[1], batch_size=0), "batch_size"),
    (dict(data=[1], download_func=3), "download_func"),
])
def test_legacy_dataset_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        LegacyDataset(**kwargs)
