"""Position in a loader across calls: the train loader's across ``train()``
calls, the validation loader's across ``validate(num_steps=...)`` calls.

``epoch`` counts passes over the loader. ``take(None)`` finishes the current
pass (or runs a whole new one when the current pass is used up);
``take(k)`` yields exactly ``k`` batches, wrapping into new passes. Each new
pass reshuffles a distributed sampler with ``set_epoch``. ``steps`` counts
every batch ever handed out; the runner's commit hook runs before a batch is
fetched, when the state is exactly "``steps`` batches done".

Restoring a position inside a pass replays the pass up to it. A loader whose
order cannot be replayed (``replayable = False``: a streamed Ray Data shard)
restarts the interrupted pass from its first batch instead (at-least-once).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Dict, Iterator, Optional

import torch
from torch.utils.data import DataLoader, IterableDataset

from raysgd.config import check_num_steps
from raysgd.errors import ConfigError
from raysgd.worker import distributed


_END = object()


def _known_length(loader: Any) -> Optional[int]:
    if isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset):
        return None  # its len() is an estimate
    try:
        return len(loader)
    except TypeError:
        return None


def completed_at(epoch: int, pass_done: bool) -> int:
    """Passes finished at a position (``epoch`` and ``pass_done`` of ``Passes.state_dict()``):
    ``epoch``, less one while that pass is under way."""
    return epoch if pass_done else epoch - 1


class _Peekable:
    """An iterator that knows it is done before the next ``next()``: a stream's pass
    then ends exactly at its last batch, so a commit taken there says "pass done"."""

    def __init__(self, iterator: Iterator):
        self._iterator = iterator
        self._next: Any = None
        self._peeked = False

    def done(self) -> bool:
        if not self._peeked:
            self._next, self._peeked = next(self._iterator, _END), True
        return self._next is _END

    def __next__(self) -> Any:
        if self.done():
            raise StopIteration
        self._peeked = False
        return self._next

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


class Passes:
    """Remembers the pass index and the batch position inside it."""

    def __init__(self, loader: Any, what: str = "train loader", allow_empty: bool = False):
        self.loader = loader
        self.what = what
        # An empty validation loader (a tiny shard) validates nothing; an empty
        # train loader is a mistake worth an error.
        self.allow_empty = allow_empty
        self.epoch_idx = -1  # pass of the last batch handed out; -1 before any
        self.batch_idx = 0   # batches handed out in that pass
        self.steps = 0       # batches handed out in all passes
        self._iterator: Optional[Iterator] = None
        self._pass_rng = torch.get_rng_state()
        self._length = _known_length(loader) if loader is not None else None
        # Set by a restore that restarts the pass (``{"epoch", "batches"}`` read before);
        # the resumed call may then start that pass again.
        self.restarted: Optional[Dict[str, int]] = None

    def use_loader(self, loader: Any) -> None:
        """Read the passes to come from ``loader``; counters are kept and a pass in
        progress is abandoned (it counts as done)."""
        self.close()
        self.loader = loader
        self._length = _known_length(loader)

    @property
    def epoch(self) -> int:
        """1-based number of the pass the last batch belonged to."""
        return self.epoch_idx + 1

    @property
    def completed(self) -> int:
        """Passes finished: ``completed_at`` the current position."""
        return completed_at(self.epoch, self._exhausted())

    @property
    def replayable(self) -> bool:
        return getattr(self.loader, "replayable", True)

    def take(self, num_steps: Optional[int], before_batch: Optional[Callable[[int], None]] = None,
             resume: bool = False) -> "PassIterator":
        """Batches for one ``train()`` call; ``resume`` continues a call cut short by a failure."""
        check_num_steps(num_steps)
        return PassIterator(self, num_steps, before_batch,
                            may_start_pass=not resume or self.restarted is not None)

    def take_new_pass(self, num_steps: Optional[int],
                      before_batch: Optional[Callable[[int], None]] = None) -> "PassIterator":
        """A new pass, cut after ``num_steps`` batches and never wrapped (validation of a
        stream: its ranks' shards differ in length, so each call starts them together)."""
        check_num_steps(num_steps)
        self.close()
        return PassIterator(self, num_steps, before_batch, wrap=False)

    def _start_pass(self) -> None:
        self.epoch_idx += 1
        self.batch_idx = 0
        self.restarted = None
        self._open_iterator()

    def _open_iterator(self) -> None:
        # A non-distributed shuffling sampler draws its order from the global
        # torch RNG here; remember that state so a resume replays the same order.
        self._pass_rng = torch.get_rng_state()
        distributed.set_sampler_epoch(self.loader, self.epoch_idx)
        self._iterator = iter(self.loader) if self.replayable else _Peekable(iter(self.loader))

    def close(self) -> None:
        """End the pass in progress now (a Ray Data stream then tells its coordinator)."""
        close = getattr(self._iterator, "close", None)
        self._iterator = None
        if close is not None:
            close()

    def _exhausted(self) -> bool:
        if self._iterator is None or (self._length is not None and self.batch_idx >= self._length):
            return True
        return isinstance(self._iterator, _Peekable) and self._iterator.done()

    def has_next(self, may_wrap: bool) -> bool:
        """False when the current pass is known to be over and may not wrap."""
        return may_wrap or not self._exhausted()

    def next_batch(self, may_wrap: bool) -> Any:
        """Next batch; starts a new pass when the current one is over and ``may_wrap``."""
        if self._exhausted():
            if not may_wrap:
                raise StopIteration
            # A fresh pass that is empty ends here: opening yet another would make a
            # stream's rank wait for a pass the other ranks never start.
            self._start_pass()
            batch = self._next_of_fresh_pass()
        else:
            try:
                batch = next(self._iterator)
            except StopIteration:
                self._iterator = None
                if not may_wrap:
                    raise
                self._start_pass()
                batch = self._next_of_fresh_pass()
        self.batch_idx += 1
        self.steps += 1
        return batch

    def _next_of_fresh_pass(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = None
            if self.allow_empty:
                raise
            raise ConfigError(f"The {self.what} yielded no batches; check its dataset and "
                              "batch_size (drop_last=True with a small shard gives none).") from None

    # ----------------------------------------------------------------- state
    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "batch_idx": self.batch_idx, "steps": self.steps,
                "pass_done": self._exhausted(), "pass_rng": self._pass_rng}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume at the saved position; mid-pass, replay the pass up to it (restart it for a
        loader that cannot replay), unless the pass in progress is there already."""
        if self._at(state):
            return  # a rollback after a call that read no batch: keep the pass going
        self.epoch_idx = int(state.get("epoch", 0)) - 1
        batch_idx = int(state.get("batch_idx", 0))
        self.close()
        self.batch_idx = batch_idx
        self.steps = int(state.get("steps", 0))
        self.restarted = None
        if self.loader is not None and not state.get("pass_done", True) and batch_idx > 0:
            if not self.replayable:
                self._restart_pass(batch_idx)
                return
            if state.get("pass_rng") is not None:
                torch.set_rng_state(state["pass_rng"])
            self._open_iterator()
            for done in range(batch_idx):
                if next(self._iterator, _END) is _END:
                    # A shorter shard (other worker count, other data): the
                    # saved position is past its end, so the pass is over.
                    warnings.warn(f"Resuming at batch {batch_idx} of pass {self.epoch}, but this "
                                  f"worker's loader has only {done} batches; the next train() "
                                  "starts a new pass.", stacklevel=2)
                    self.batch_idx, self._iterator = done, None
                    break

    def _at(self, state: Dict[str, Any]) -> bool:
        # Only for streams: a replayable loader replays, since its order (pass_rng) may differ.
        return not self.replayable and self._iterator is not None and (
            self.epoch, self.batch_idx, self.steps) == (
            int(state.get("epoch", 0)), int(state.get("batch_idx", 0)), int(state.get("steps", 0)))

    def _restart_pass(self, batches_read: int) -> None:
        """The pass of the saved position starts again at its first batch."""
        self.restarted = {"epoch": self.epoch, "batches": batches_read}
        self.epoch_idx -= 1  # _start_pass counts the same pass again
        self.batch_idx, self._iterator = 0, None


class PassIterator:
    """The iterator ``train_epoch`` receives; exposes ``epoch_idx`` and ``batch_idx``."""

    def __init__(self, passes: Passes, num_steps: Optional[int],
                 before_batch: Optional[Callable[[int], None]] = None, may_start_pass: bool = True,
                 wrap: bool = True):
        self._passes = passes
        self._remaining = num_steps
        self._wrap = wrap
        self._before_batch = before_batch
        self._first = may_start_pass
        self.done = 0  # batches handed out by this iterator
        self.batch_idx = passes.batch_idx
        self.epoch_idx = max(passes.epoch_idx, 0)

    def __iter__(self):
        return self

    def __len__(self) -> int:
        if self._remaining is not None:
            return self._remaining
        if self._passes._length is None:
            raise TypeError("this train loader has no length")
        done = self._passes.batch_idx if not self._passes._exhausted() else 0
        return self._passes._length - done

    def __next__(self):
        if self._remaining is not None and self._remaining <= 0:
            raise StopIteration
        # Without num_steps a call finishes one pass: it may start a pass only
        # before its first batch. With num_steps it wraps as often as needed.
        may_wrap = self._first or (self._remaining is not None and self._wrap)
        if self._before_batch is not None and self._passes.has_next(may_wrap):
            self._before_batch(self.done)
        batch = self._passes.next_batch(may_wrap)
        self._first = False
        self.done += 1
        if self._remaining is not None:
            self._remaining -= 1
        self.batch_idx = self._passes.batch_idx - 1
        self.epoch_idx = self._passes.epoch_idx
        return batch
