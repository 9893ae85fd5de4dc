"""Worker-side torch.distributed plumbing: rendezvous, devices, DDP, samplers.

Everything here is a no-op at world size 1, so one runner class serves the
single-process and the multi-process case alike.
"""
from __future__ import annotations

import logging
import warnings
from datetime import timedelta
from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from raysgd.config import RankInfo

logger = logging.getLogger("raysgd")


def create_store(host: str, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Open rank 0's rendezvous store on a port the OS picks (no port race)."""
    return dist.TCPStore(host, 0, world_size, True, timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def collective_timeout(timeout_s: float) -> float:
    """Collectives time out well after the driver's hang detection (``timeout_s``).

    The driver then always sees a hang as a hang and tears the group down
    itself; a gloo timeout on a survivor would surface as a bare RuntimeError.
    """
    return 2 * timeout_s + 30


def init_process_group(backend: str, rank: RankInfo, host: str, port: int,
                       timeout_s: float, store: Optional[dist.Store] = None) -> None:
    """Join the process group; rank 0 passes the store it created."""
    if store is None:
        store = dist.TCPStore(host, port, rank.world_size, False, timedelta(seconds=timeout_s))
    dist.init_process_group(backend, store=store, rank=rank.world_rank,
                            world_size=rank.world_size, timeout=timedelta(seconds=timeout_s))


def init_single_process_group(backend: str) -> None:
    """A world of one, for code that calls collectives or wraps DDP unconditionally."""
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def from_rank_0(value: int, rank: RankInfo) -> int:
    """Rank 0's ``value`` on every rank (a collective: every rank calls it at set-up)."""
    if not (rank.distributed and dist.is_initialized()):
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def destroy_process_group() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def choose_device(use_gpu: bool) -> torch.device:
    """CUDA device 0 of what Ray made visible to this process, else the CPU."""
    if use_gpu and torch.cuda.is_available():
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def device_ids(device: torch.device) -> Optional[list]:
    return [device.index] if device.type == "cuda" else None


def wrap_ddp(model: torch.nn.Module, device: torch.device,
             ddp_args: Mapping[str, Any]) -> DistributedDataParallel:
    return DistributedDataParallel(model, device_ids=device_ids(device), **dict(ddp_args))


def strip_ddp_prefix(state: dict, model: torch.nn.Module) -> dict:
    """Accept state dicts saved from a DDP-wrapped model ("module." keys)."""
    if state and all(k.startswith("module.") for k in state) and not any(
            k.startswith("module.") for k in model.state_dict()):
        return type(state)((k[len("module."):], v) for k, v in state.items())
    return state


_LOADER_OPTIONS = ("batch_size", "num_workers", "collate_fn", "pin_memory", "drop_last",
                   "timeout", "worker_init_fn", "multiprocessing_context", "generator",
                   "prefetch_factor", "persistent_workers", "pin_memory_device")


def with_distributed_sampler(loader: Any, rank: RankInfo) -> Any:
    """Rebuild a DataLoader so each rank reads its own shard; keep its options."""
    if not isinstance(loader, DataLoader) or isinstance(loader.sampler, DistributedSampler):
        return loader
    reason = _cannot_shard(loader)
    if reason:
        warnings.warn(f"Not adding a DistributedSampler: {reason}. Every worker will read "
                      "the whole dataset; shard it yourself or pass add_dist_sampler=False "
                      "to silence this warning.", stacklevel=3)
        return loader
    sampler = DistributedSampler(loader.dataset, num_replicas=rank.world_size,
                                 rank=rank.world_rank,
                                 shuffle=isinstance(loader.sampler, RandomSampler))
    options = {name: getattr(loader, name) for name in _LOADER_OPTIONS if hasattr(loader, name)}
    if options.get("num_workers", 0) == 0:
        options.pop("prefetch_factor", None)
        options.pop("persistent_workers", None)
    return DataLoader(loader.dataset, sampler=sampler, **options)


def _cannot_shard(loader: DataLoader) -> str:
    if isinstance(loader.dataset, IterableDataset):
        return "the loader reads an IterableDataset"
    if loader.batch_size is None:
        return "the loader uses a custom batch_sampler"
    return ""


def set_sampler_epoch(loader: Any, epoch: int) -> None:
    """Reshuffle a distributed sampler for a new pass (legacy never did)."""
    sampler = getattr(loader, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(epoch)


def local_ranks(node_ids: list) -> list:
    """Index of each worker among the workers on its node, in rank order."""
    seen: dict = {}
    out = []
    for node in node_ids:
        out.append(seen.get(node, 0))
        seen[node] = out[-1] + 1
    return out

