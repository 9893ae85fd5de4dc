"""Driver side of Ray Data input: which datasets feed the workers, and their splits.

Per slot the dataset is the last ``train(dataset=...)`` (legacy, train only),
else ``TorchTrainer(datasets=...)``'s, else the one rank 0's ``setup()`` registered. The driver calls ``streaming_split`` so its coordinator actor is
owned by the driver and outlives any worker: training splits are equal (every
rank runs the same number of steps, so DDP's collectives match); validation
splits are not (every row is validated exactly once). A worker group makes a
new :class:`Split` whenever its ranks set up or restore a commit and closes the
old one, so a pass interrupted by a failure never waits on a dead consumer.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import ray

from raysgd.data.dataset_config import DatasetConfig, check_dataset, is_ray_dataset

logger = logging.getLogger("raysgd")

Source = Tuple[Any, DatasetConfig]  # a ray.data.Dataset and how its batches are built


def _ray_collate(fmt: DatasetConfig) -> DatasetConfig:
    if fmt.collate_fn is None:
        return fmt  # nothing for Ray Data to wrap: it stays unimported (see ray_collate)
    from raysgd.data.ray_collate import ray_collate

    return ray_collate(fmt)


def as_source(dataset: Any, fmt: DatasetConfig) -> Source:
    """A legacy ``raysgd.data.Dataset`` brings its items and batch format; a Ray one uses ``fmt``."""
    if is_ray_dataset(dataset):
        return dataset, _ray_collate(fmt)
    from raysgd.data.ray_collate import from_items

    return from_items(dataset.items), _ray_collate(dataset.batch_config())


class DataFeed:
    """The trainer's datasets; shared by every worker group it starts."""

    def __init__(self, datasets: Dict[str, Any], fmt: DatasetConfig):
        self.fmt = _ray_collate(fmt)
        self._given = {slot: as_source(ds, fmt) for slot, ds in datasets.items()}
        self.call_train: Optional[Tuple[Any, Source]] = None  # (what the user passed, source)

    def switch_train(self, dataset: Any, refresh: Callable[[], None]) -> None:
        """``train(dataset=...)``: a dataset other than the last one becomes the train input
        and ``refresh`` gives the ranks shards of it. If that raises, the last one stays
        (the next ``train(dataset=...)`` tries again; a ``train()`` rolls back onto new shards)."""
        check_dataset("train(dataset=...)", dataset)
        previous = self.call_train
        if previous is not None and previous[0] is dataset:
            return
        self.call_train = (dataset, as_source(dataset, self.fmt))
        try:
            refresh()
        except BaseException:
            self.call_train = previous
            raise

    def sources(self, registered: Dict[str, Any]) -> Dict[str, Source]:
        """Per slot, the dataset to split: the last ``train(dataset=...)``, else the
        trainer's ``datasets``, else the one rank 0 registered."""
        sources = {slot: (ds, self.fmt) for slot, ds in registered.items()}
        sources.update(self._given)
        if self.call_train is not None:
            sources["train"] = self.call_train[1]
        return sources


class GroupShards:
    """A worker group's current :class:`Split`: renewed on every set-up and in-place
    restore, closed with the group."""

    def __init__(self, feed: Optional[DataFeed]):
        self.feed = feed
        self.registered: Dict[str, Any] = {}  # datasets rank 0's setup() registered
        self._split: Optional[Split] = None

    def renew(self, nodes: Sequence[str], attach: Callable[[List[dict]], None]) -> List[str]:
        """``attach`` each rank's new shards (ranks on ``nodes``); the slots fed. The old
        split is closed once the new one is attached: if attaching fails, the ranks keep it."""
        sources = self.feed.sources(self.registered) if self.feed is not None else {}
        if not sources:
            self.close()
            return []
        split = Split(sources, nodes)
        try:
            attach([split.for_rank(rank) for rank in range(len(nodes))])
        except BaseException:
            split.close()
            raise
        self.close()
        self._split = split
        return sorted(sources)

    def close(self) -> None:
        if self._split is not None:
            self._split.close()
            self._split = None


def log_restart(restarted: Optional[Dict[str, int]]) -> None:
    """Say that a restore restarted a pass of Ray Data input (see ``Passes``)."""
    if restarted:
        logger.warning(
            "raysgd: Ray Data input: pass %d restarts from its first batch on new shards "
            "(at-least-once): its %d batch(es) read before the commit are read again, and "
            "the call's metrics count from the restart", restarted["epoch"],
            restarted["batches"])


class Split:
    """One ``streaming_split`` per slot for ``n`` ranks; each rank's iterators by rank."""

    def __init__(self, sources: Dict[str, Source], nodes: Sequence[str]):
        n = len(nodes)
        # Hints must be real node ids (a local rank 0 without Ray has none).
        hints = list(nodes) if all(node and node != "local" for node in nodes) else None
        self._iterators: Dict[str, List[Any]] = {}
        self._formats = {slot: fmt for slot, (_, fmt) in sources.items()}
        try:
            for slot, (dataset, _) in sources.items():
                self._iterators[slot] = dataset.streaming_split(
                    n, equal=slot == "train", locality_hints=hints)
        except BaseException:
            self.close()
            raise

    def for_rank(self, rank: int) -> Dict[str, Tuple[Any, DatasetConfig]]:
        return {slot: (its[rank], self._formats[slot]) for slot, its in self._iterators.items()}

    def close(self) -> None:
        """Stop the coordinators now, rather than when the last handle is collected:
        a coordinator mid-pass keeps an executor (and the blocks it buffered) alive."""
        for iterators in self._iterators.values():
            coordinator = getattr(iterators[0], "_coord_actor", None) if iterators else None
            if coordinator is not None:
                try:
                    ray.kill(coordinator, no_restart=True)
                except Exception as exc:  # noqa: BLE001 - it may be gone with its node
                    logger.debug("raysgd: could not stop a split coordinator: %r", exc)
        self._iterators = {}
