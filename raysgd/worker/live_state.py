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
before. A local rank (in the driver) keeps its commits as Python objects, so they copy.
"""
from __future__ import annotations

from typing import Any, Callable, List, Set, Tuple

import torch

from raysgd.state.packing import own_copies
from raysgd.worker.host_copy import host_copies


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor  # a DTensor's shard


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def step_only_storages(models: List[torch.nn.Module], optimizers: List[Any]) -> Set[int]:
    """The storages of every parameter and every optimizer state tensor: what only an
    optimizer's step writes."""
    found = {_storage(_local(param)) for model in models for param in model.parameters()}
    for optimizer in optimizers:
        for per_param in optimizer.state.values():
            found.update(_storage(_local(value)) for value in per_param.values()
                         if isinstance(value, torch.Tensor))
    found.discard(0)  # storages without memory (empty tensors) have no address
    return found


class CopiedCommits:
    """Every tensor of a commit copied to host memory at once (a local rank)."""

    def content(self, state: Any, models: list, optimizers: list) -> Any:
        return host_copies(state)

    materialize = None  # nothing of the live state to copy later

    def changed(self) -> bool:
        return False


class LiveCommits:
    """CPU parameters and optimizer state viewed, not copied (a remote rank)."""

    def __init__(self):
        self._viewed: List[Tuple[torch.Tensor, int]] = []  # the last commit's, and versions

    def content(self, state: Any, models: list, optimizers: list) -> Any:
        storages = step_only_storages(models, optimizers)
        viewed = []

        def view(tensor: torch.Tensor) -> bool:
            if _storage(tensor) not in storages:
                return False
            viewed.append((tensor, tensor._version))  # a detached view shares the counter
            return True

        copies = host_copies(state, view=view)
        self._viewed = viewed
        return copies

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
