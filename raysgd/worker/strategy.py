"""One strategy object per worker: how registered models are wrapped and how their state is
taken and put back. Chosen once from ``WorkerSettings.strategy`` (``create_strategy``); the
operator and the runner call the object and never ask which strategy is on.

``ReplicatedStrategy`` (``strategy="ddp"``): every rank holds the full state, so a commit
carries rank 0's models and optimizers and every other rank adds only its position.
``raysgd.worker.fsdp.FSDPStrategy``: every rank holds and commits only its shards.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional, Sequence

import torch
from torch import nn

from raysgd.config import RankInfo
from raysgd.errors import CheckpointError
from raysgd.strategy import FSDP
from raysgd.worker import distributed


class ReplicatedStrategy:
    """Full state on every rank; ``DistributedDataParallel`` when distributed and
    ``wrap_ddp`` (else the operator synchronises gradients itself)."""

    replicated = True  # any rank's models and optimizers are everyone's (worker/survivor.py)

    def __init__(self, rank: RankInfo, device: torch.device, wrap_ddp: bool = True):
        self.rank = rank
        self.device = device
        self.wrap_ddp = wrap_ddp and rank.distributed

    # ------------------------------------------------------------ set-up
    def place(self, models: List[nn.Module]) -> List[nn.Module]:
        """The models on this worker's device (before precision set-up)."""
        return [model.to(self.device) for model in models]

    def shard(self, models: List[nn.Module], optimizers: List[Any], ddp_args: dict) -> None:
        """Nothing to shard: every rank keeps the whole model."""

    def wrap_model(self, model: nn.Module, ddp_args: dict) -> nn.Module:
        """The module the loops call (the optimizers keep pointing at the original's
        parameters)."""
        return distributed.wrap_ddp(model, self.device, ddp_args) if self.wrap_ddp else model

    # ------------------------------------------------------------ training
    def no_sync(self, models: Sequence[nn.Module]):
        """Skip gradient synchronisation inside the block (non-final micro-batches)."""
        stack = contextlib.ExitStack()
        for model in models:
            if hasattr(model, "no_sync"):  # DDP, or the user's own wrapper (wrap_ddp=False)
                stack.enter_context(model.no_sync())
        return stack

    def clip_grad_norm_(self, params: list, max_norm: float, norm_type: float) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    # ------------------------------------------------------------ state
    def commit_state(self, models: list, optimizers: list) -> Dict[str, Any]:
        """This rank's model and optimizer part of a commit: all of it on rank 0."""
        if self.rank.world_rank != 0:
            return {}
        return self.full_state(models, optimizers)

    def replica_state(self, models: list, optimizers: list) -> Dict[str, Any]:
        """This rank's full models and optimizers, whichever rank it is (a survivor standing
        in for rank 0's part of a commit)."""
        return {"models": [model.state_dict() for model in models],
                "optimizers": [opt.state_dict() for opt in optimizers]}

    def full_state(self, models: list, optimizers: list) -> Optional[Dict[str, Any]]:
        """The full, unsharded models and optimizers (``save()``'s format); rank 0 only
        (None elsewhere); may be a collective, so every rank calls it."""
        if self.rank.world_rank != 0:
            return None
        return self.replica_state(models, optimizers)

    def load(self, models: list, optimizers: list, primary: Dict[str, Any],
             sources: Sequence[Dict[str, Any]]) -> None:
        """Load models and optimizers from a full state (``primary``: a commit of rank 0 or
        a checkpoint file). ``sources`` are every rank's commit parts, for sharded states."""
        if "models" not in primary:
            raise CheckpointError("This state was written by strategy=FSDP(...) as shards and "
                                  "has no full models; load a file written by trainer.save() "
                                  "instead, or resume with strategy=FSDP(...).")
        for model, model_state in zip(models, primary["models"]):
            model.load_state_dict(distributed.strip_ddp_prefix(model_state, model))
        for optimizer, opt_state in zip(optimizers, primary["optimizers"]):
            optimizer.load_state_dict(opt_state)

    def full_models(self, models: list, to_cpu: bool) -> Optional[list]:
        """Rank 0's models, unwrapped (None on other ranks)."""
        if self.rank.world_rank != 0:
            return None
        if to_cpu and self.device.type != "cpu":
            import copy
            return [copy.deepcopy(model).cpu() for model in models]
        return list(models)


def create_strategy(spec: Any, rank: RankInfo, device: torch.device, precision: Any,
                    wrap_ddp: bool = True):
    """The worker's strategy object for ``WorkerSettings.strategy``."""
    if isinstance(spec, FSDP):
        from raysgd.worker.fsdp import FSDPStrategy  # torch.distributed.fsdp only when used
        return FSDPStrategy(spec, rank, device, precision)
    return ReplicatedStrategy(rank, device, wrap_ddp)
