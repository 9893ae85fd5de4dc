"""What a commit copies and what it only views of the live state; chosen once per runner.

A commit used to copy the whole state on the training thread (``host_copies``) and Ray then
copied that copy into the object store: two passes over the state on the training path and
a third copy of it alive while Ray stored the second. On a remote rank the commit is a
return value that Ray stores before the driver can see it, so it can view the CPU tensors
that only an optimizer step changes (the models' parameters and the optimizers' state) and
let Ray's store be the only copy, made beside the next forward and backward, as CheckFreq
(FAST '21) pipelines its snapshots. The training thread then waits for the driver to
acknowledge the commit before the optimizer's next step (a step pre-hook on every
registered optimizer), before the next batch and at the call's end
(``raysgd.worker.handoff.CommitHandoff.settle``). Everything else (buffers, which a forward
may change; schedulers, scaler, the operator's own state; tensors on a GPU) is copied as
before. A local rank (in the driver) keeps its commits as Python objects, so they copy. So
does a state under ``VIEW_MIN_BYTES``: copying it costs less than the wait for the driver.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import torch

from raysgd.state.packing import own_copies
from raysgd.worker.host_copy import host_copies

# Below this many bytes of parameters and optimizer state a commit copies them: a copy of
# 32 MiB takes a few milliseconds, about one round trip to the driver (the acknowledgement).
VIEW_MIN_BYTES = 32 * 2**20


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _step_only(models: List[torch.nn.Module], optimizers: List[Any]):
    """Every parameter and optimizer state tensor (a DTensor's shard): what only an
    optimizer's step writes."""
    for model in models:
        yield from (_local(param) for param in model.parameters())
    for optimizer in optimizers:
        for per_param in optimizer.state.values():
            yield from (_local(value) for value in per_param.values()
                        if isinstance(value, torch.Tensor))


def step_only_storages(models: List[torch.nn.Module], optimizers: List[Any]) -> Dict[int, int]:
    """The storages of :func:`_step_only`'s tensors: address -> bytes."""
    found = {_storage(t): t.untyped_storage().nbytes() for t in _step_only(models, optimizers)}
    found.pop(0, None)  # storages without memory (empty tensors) have no address
    return found


class CopiedCommits:
    """Every tensor of a commit copied to host memory at once (a local rank)."""

    def content(self, state: Any, models: list, optimizers: list) -> Any:
        return host_copies(state)

    materialize = None  # nothing of the live state to copy later

    def views(self) -> bool:
        return False

    def changed(self) -> bool:
        return False


class LiveCommits:
    """CPU parameters and optimizer state viewed, not copied (a remote rank)."""

    def __init__(self, min_bytes: int = VIEW_MIN_BYTES):
        self.min_bytes = min_bytes
        self._viewed: List[Tuple[torch.Tensor, int]] = []  # the last commit's, and versions

    def content(self, state: Any, models: list, optimizers: list) -> Any:
        storages = step_only_storages(models, optimizers)
        viewed = []
        if sum(storages.values()) < self.min_bytes:
            self._viewed = []
            return host_copies(state)

        def view(tensor: torch.Tensor) -> bool:
            if _storage(tensor) not in storages:
                return False
            viewed.append((tensor, tensor._version))  # a detached view shares the counter
            return True

        copies = host_copies(state, view=view)
        self._viewed = viewed
        return copies

    def views(self) -> bool:
        """Whether the last commit views the live state."""
        return bool(self._viewed)

    def changed(self) -> bool:
        """Whether something wrote a tensor the last commit views since it was taken; asked
        before the next optimizer step, so only a write outside a step counts."""
        viewed, self._viewed = self._viewed, []
        return any(tensor._version != version for tensor, version in viewed)

    @staticmethod
    def materialize(snapshot: Any) -> Any:
        """A queued snapshot given its own copies, as the live state moves on untaken."""
        return own_copies(snapshot)


def create_commit_content(views: bool, optimizers: list, settle: Callable[[], None]):
    """``LiveCommits`` where asked for and every optimizer can call ``settle`` before each
    of its steps (a user's ``train_batch`` too: a step pre-hook); else ``CopiedCommits``."""
    if not views or not all(isinstance(opt, torch.optim.Optimizer) for opt in optimizers):
        return CopiedCommits()
    for optimizer in optimizers:
        optimizer.register_step_pre_hook(lambda *_: settle())
    return LiveCommits()
