"""``FSDPStrategy``: registered models sharded with torch's ``fully_shard`` (FSDP2).

Each rank holds ``1/N`` of every parameter, gradient and optimizer state (``DTensor``s
sharded on dim 0). The operator's optimizers were built on the unsharded parameters in
``setup()``; ``wrap`` re-points them (and so their schedulers) at the sharded ones by
parameter name before any step. A model built on the ``meta`` device is sharded first and
only then allocated (``to_empty``) and initialised, so no rank ever holds all of it.

State: a commit holds this rank's chunks only (``raysgd.state.chunks``); a restore takes the
rank's own chunks back, or cuts its new piece from the overlapping old chunks when the world
size changed; ``save()``'s full format is gathered one tensor at a time to rank 0's CPU;
disk checkpoints are DCP's (``raysgd.worker.dcp_io``), written by every rank.
"""
from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from raysgd.config import RankInfo
from raysgd.errors import CheckpointError, ConfigError
from raysgd.state.chunks import as_tensor, assemble, make_chunk
from raysgd.state.packing import verify_packed
from raysgd.state.slab import reading
from raysgd.strategy import FSDP
from raysgd.state.sharded_dir import SHARDED_KEY
from raysgd.worker import dcp_io, distributed

# Each mesh this process makes gets a name of its own. DTensor caches sharding decisions by
# mesh, and two meshes of the same size compare equal; a pooled process may hold another rank
# in its next trainer's mesh, and a cached decision would bring back the old mesh with its old
# coordinate. The count is not reset with the process, so a name never repeats in it.
_MESH_NAMES = (f"raysgd-shard-{n}" for n in itertools.count())
_UNSET = object()


def _layout(tensor: DTensor):
    """(local shape, global offset) of this rank's piece of ``tensor``."""
    return compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh,
                                                 tensor.placements)


def _is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def _meta_copy(model: nn.Module) -> nn.Module:
    """The module tree with every parameter and buffer on ``meta``: a skeleton that
    ``get_model()`` fills with the gathered weights, at no memory cost now."""
    memo = {}
    for tensor in list(model.parameters()) + list(model.buffers()):
        meta = torch.empty_like(tensor, device="meta")
        memo[id(tensor)] = nn.Parameter(meta, tensor.requires_grad) \
            if isinstance(tensor, nn.Parameter) else meta
    return copy.deepcopy(model, memo)


class FSDPStrategy:
    """Sharded parameters, gradients and optimizer state; see the module docstring."""

    def __init__(self, spec: FSDP, rank: RankInfo, device: torch.device, precision: Any):
        self.spec = spec
        self.rank = rank
        self.device = device
        dtype = getattr(precision, "dtype", None)  # autocast precisions carry their dtype
        self.mp_policy = MixedPrecisionPolicy(
            param_dtype=dtype, reduce_dtype=(spec.reduce_dtype or torch.float32) if dtype else None)
        self._skeletons: List[nn.Module] = []
        self._checkpoint_group: Any = _UNSET  # DCP's own gloo group, made at the first save
        self._last_write: Optional[dcp_io.ShardWrite] = None

    # ------------------------------------------------------------ set-up
    def place(self, models: List[nn.Module]) -> List[nn.Module]:
        """Models on the device; ``meta`` models stay there until sharded."""
        return [model if _is_meta(model) else model.to(self.device) for model in models]

    def shard(self, models: List[nn.Module], optimizers: List[Any], ddp_args: dict) -> None:
        """Shard every model in place and re-point the optimizers at the shards."""
        if ddp_args:
            warnings.warn(f"register(ddp_args={ddp_args!r}) is ignored under strategy=FSDP(...).",
                          stacklevel=4)
        names = self._parameter_names(models, optimizers)
        if self.rank.world_rank == 0:
            self._skeletons = [_meta_copy(model) for model in models]
        if not dist.is_initialized():  # a world of one still shards (the same code path)
            distributed.init_single_process_group("nccl" if self.device.type == "cuda" else "gloo")
        mesh = init_device_mesh(self.device.type, (self.rank.world_size,),
                                mesh_dim_names=(next(_MESH_NAMES),))
        options = dict(mesh=mesh, reshard_after_forward=self.spec.reshard_after_forward,
                       mp_policy=self.mp_policy,
                       offload_policy=CPUOffloadPolicy() if self.spec.cpu_offload else None)
        options = {key: value for key, value in options.items() if value is not None}
        for model in models:
            meta = _is_meta(model)
            for sub in reversed(list(model.modules())[1:]):  # children before parents
                if self._is_unit(sub):
                    fully_shard(sub, **options)
            fully_shard(model, **options)
            if meta:
                self._materialize(model)
        self._repoint(models, optimizers, names)

    def wrap_model(self, model: nn.Module, ddp_args: dict) -> nn.Module:
        return model  # sharded in place: the loops call the module itself

    def _is_unit(self, module: nn.Module) -> bool:
        units = self.spec.units
        if units is None:
            return False
        if isinstance(units, type) or isinstance(units, tuple):
            return isinstance(module, units)
        return bool(units(module))

    def _materialize(self, model: nn.Module) -> None:
        model.to_empty(device=self.device)
        init = self.spec.init_weights
        # On a CPU mesh DTensor's random ops warn that they draw per shard (each rank from its
        # own generator): a valid random initialisation, not the unsharded model's numbers.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "DTensor random operators", UserWarning)
            for sub in model.modules():
                if init is not None:
                    init(sub)
                elif hasattr(sub, "reset_parameters"):
                    sub.reset_parameters()

    @staticmethod
    def _parameter_names(models: List[nn.Module], optimizers: List[Any]) -> Dict[int, tuple]:
        names = {id(p): (i, name) for i, model in enumerate(models)
                 for name, p in model.named_parameters()}
        for optimizer in optimizers:
            if optimizer.state:
                raise ConfigError(f"{type(optimizer).__name__} already has state (it stepped in "
                                  "setup()); under strategy=FSDP(...) build optimizers in "
                                  "setup() and step them only in training.")
            stray = [tuple(p.shape) for g in optimizer.param_groups for p in g["params"]
                     if id(p) not in names]
            if stray:
                raise ConfigError(f"{type(optimizer).__name__} holds parameters of shapes "
                                  f"{stray[:4]} that belong to no registered model; FSDP can "
                                  "only shard registered models. Register every model the "
                                  "optimizers train.")
        return names

    @staticmethod
    def _repoint(models: List[nn.Module], optimizers: List[Any], names: Dict[int, tuple]) -> None:
        sharded = [dict(model.named_parameters()) for model in models]
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["params"] = [sharded[names[id(p)][0]][names[id(p)][1]]
                                   for p in group["params"]]

    # ------------------------------------------------------------ training
    def no_sync(self, models: Sequence[nn.Module]):
        stack = contextlib.ExitStack()
        for model in models:
            if isinstance(model, FSDPModule):
                model.set_requires_gradient_sync(False)
                stack.callback(model.set_requires_gradient_sync, True)
        return stack

    def clip_grad_norm_(self, params: list, max_norm: float, norm_type: float) -> torch.Tensor:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    # ------------------------------------------------------------ state
    def commit_state(self, models: list, optimizers: list) -> Dict[str, Any]:
        """This rank's chunks of every model and optimizer; nothing is gathered."""
        return {"shards": {"models": [_chunked(m.state_dict()) for m in models],
                           "optimizers": [_chunked(o.state_dict()) for o in optimizers]}}

    def full_state(self, models: list, optimizers: list) -> Optional[Dict[str, Any]]:
        """Every tensor gathered in turn and kept on rank 0's CPU only (a collective)."""
        keep = self.rank.world_rank == 0
        state = {"models": [_gathered(m.state_dict(), keep) for m in models],
                 "optimizers": [_gathered(o.state_dict(), keep) for o in optimizers]}
        return state if keep else None

    def save_sharded(self, models: list, optimizers: list, path: str) -> dcp_io.ShardWrite:
        """Write this rank's shards in DCP format into the local directory ``path`` (a
        collective; a sharded disk checkpoint, ``raysgd.worker.staging``): on GPUs in the
        background once the state is copied (the previous write finishes first), on CPUs
        in place (``FSDP(async_checkpoints=...)``, ``dcp_io.writes_async``)."""
        if self._checkpoint_group is _UNSET:  # every rank's first save: a collective too
            self._checkpoint_group = dcp_io.checkpoint_group() \
                if dcp_io.writes_async(self.spec.async_checkpoints, self.device.type) else None
        self._last_write = dcp_io.save(models, optimizers, path, self._checkpoint_group,
                                       self._last_write)
        return self._last_write

    def load(self, models: list, optimizers: list, primary: Dict[str, Any],
             sources: Sequence[Dict[str, Any]]) -> None:
        if SHARDED_KEY in primary:  # a sharded disk checkpoint: DCP reshards as it reads
            sharded = primary[SHARDED_KEY]
            dcp_io.load(models, optimizers, sharded["files"], sharded.get("fresh_optimizers", ()))
            return
        if "shards" in primary:
            parts = [source["shards"] for source in sources]
        else:  # a full state: save()'s file or load_state_dict(), sliced by every rank
            full = [distributed.strip_ddp_prefix(state, model)
                    for state, model in zip(primary["models"], models)]
            parts = [{"models": full, "optimizers": primary["optimizers"]}]
        with reading():  # each slab mapped once, not once per tensor
            for i, model in enumerate(models):
                model.load_state_dict(_model_state(model, [p["models"][i] for p in parts]))
            for i, optimizer in enumerate(optimizers):
                optimizer.load_state_dict(_optimizer_state(optimizer,
                                                           [p["optimizers"][i] for p in parts]))
        verify_packed(parts)  # a slab read while a newer commit overwrote it is refused

    def full_models(self, models: list, to_cpu: bool) -> Optional[list]:
        """Unsharded CPU copies of the models on rank 0 (gathered; None elsewhere)."""
        keep = self.rank.world_rank == 0
        states = [_gathered(model.state_dict(), keep) for model in models]
        if not keep:
            return None
        out = []
        for skeleton, state in zip(self._skeletons, states):
            model = copy.deepcopy(skeleton).to_empty(device="cpu")
            model.load_state_dict(state)
            out.append(model)
        return out


def _chunked(state: Any) -> Any:
    """``state`` with each ``DTensor`` replaced by this rank's chunk of it."""
    if isinstance(state, DTensor):
        _, offset = _layout(state)
        return make_chunk(state.to_local(), state.shape, offset)
    if isinstance(state, dict):
        return type(state)((key, _chunked(value)) for key, value in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_chunked(value) for value in state)
    return state


def _gathered(state: Any, keep: bool) -> Any:
    """``state`` with each ``DTensor`` gathered whole, one at a time, kept on the CPU where
    ``keep`` (every rank takes part in every gather, in the same order)."""
    if isinstance(state, DTensor):
        full = state.full_tensor()
        return full.to("cpu", copy=True) if keep else None
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True) if keep else None
    if isinstance(state, dict):
        return type(state)((key, _gathered(value, keep)) for key, value in state.items())
    if isinstance(state, (list, tuple)):
        return type(state)(_gathered(value, keep) for value in state)
    return state


def _piece(target: Any, values: list, name: str) -> Any:
    """The value to load for ``target``: this rank's piece of a sharded tensor, else the
    first source's value."""
    if isinstance(target, DTensor):
        local_shape, offset = _layout(target)
        local = assemble(target.shape, local_shape, offset, values, name)
        return DTensor.from_local(local.to(target.device, target.dtype), target.device_mesh,
                                  target.placements, run_check=False, shape=target.shape,
                                  stride=target.stride())
    value = values[0]
    if isinstance(value, dict):  # a chunk where this rank holds a plain tensor: take it whole
        value = value["data"]
    return as_tensor(value).clone() if not isinstance(value, (int, float)) else value


def _model_state(model: nn.Module, sources: list) -> dict:
    target = model.state_dict()
    missing = [key for key in target if any(key not in s for s in sources)]
    extra = sorted(set().union(*sources) - set(target))
    if missing or extra:
        raise CheckpointError(f"The state does not fit {type(model).__name__}: missing keys "
                              f"{missing[:5]}, unexpected keys {extra[:5]}.")
    return {key: _piece(value, [s[key] for s in sources], key) for key, value in target.items()}


def _optimizer_state(optimizer: Any, sources: list) -> dict:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, entry in sources[0]["state"].items():
        if not isinstance(index, int) or index >= len(params):
            raise CheckpointError(f"The optimizer state names parameter {index!r}, but "
                                  f"{type(optimizer).__name__} has {len(params)} parameters.")
        param = params[index]
        state[index] = {
            name: _piece(param, [s["state"][index][name] for s in sources], f"{name} of {index}")
            if isinstance(param, DTensor) and _sharded_like(entry[name], param)
            else _piece(None, [entry[name]], name)
            for name in entry}
    return {"state": state, "param_groups": copy.deepcopy(sources[0]["param_groups"])}


def _sharded_like(value: Any, param: DTensor) -> bool:
    """Whether an optimizer state value is laid out like its parameter (``exp_avg``, not
    ``step``)."""
    if isinstance(value, dict):
        return tuple(value["shape"]) == tuple(param.shape)
    return tuple(as_tensor(value).shape) == tuple(param.shape)
