"""``RunnerState``: a runner's state as ``save()``'s format, as a commit's content, and as a
survivor's hand-over; and loading it back. Mixed into :class:`raysgd.worker.runner.WorkerRunner`,
which owns the operator, the loader positions, the commits and the survivor mark. No Ray.
"""
from __future__ import annotations

import copy
from typing import Any, Dict, Optional

from raysgd.errors import CheckpointError
from raysgd.state.packing import pack_tensors
from raysgd.state.sharded_dir import SHARDED_KEY
from raysgd.worker import rng
from raysgd.worker.host_copy import host_copies
from raysgd.worker.passes import completed_at


class RunnerState:
    """The state half of the runner (module docstring)."""

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """Everything needed to resume, unsharded, as CPU tensors and plain containers
        (``save()``'s format). Every rank calls it (gathering shards is a collective);
        rank 0 returns it, the others None."""
        op = self.operator
        full = op._context.strategy.full_state(op._original_models, op._optimizers)
        if full is None:
            return None
        return self._with_own_part({**full, **self._shared_components()})

    def _commit_state(self, full: bool = False) -> Dict[str, Any]:
        """A commit's content of this rank: its position, RNGs and step; its model and
        optimizer part (the strategy says which: all of it on rank 0, or its shards); on
        rank 0 (or with ``full``, a replicated rank standing in for it) the schedulers,
        precision and operator state."""
        op = self.operator
        strategy = op._context.strategy
        state = strategy.replica_state(op._original_models, op._optimizers) if full else \
            strategy.commit_state(op._original_models, op._optimizers)
        if full or self.rank.world_rank == 0:
            state.update(self._shared_components())
        return self._with_own_part(state, lambda own: self._commits.content.content(
            own, op._original_models, op._optimizers))

    def _shared_components(self) -> Dict[str, Any]:
        op = self.operator
        state = {"schedulers": [sched.state_dict() for sched in op._schedulers],
                 "precision": op._context.precision.state_dict(), "rng_base": self._rng_base}
        extra = op.state_dict()
        if extra is not None:
            state["operator"] = extra
        return state

    def _with_own_part(self, state: Dict[str, Any], copies=host_copies) -> Dict[str, Any]:
        state = {"global_step": self.operator.global_step, **self._passes.state_dict(),
                 "rng": rng.get_state(), **state}
        return copies(state)

    def load_state_dict(self, state: Dict[str, Any], sources: Optional[list] = None) -> None:
        """Load a full state (``save()``'s format) or a commit's (``sources``: the parts of
        the ranks whose shards this rank reads)."""
        self._load_components(state, sources or [state])
        self._passes.load_state_dict(state)
        rng.set_state(state.get("rng"))

    def _load_components(self, state: Dict[str, Any], sources: list) -> None:
        op = self.operator
        self._check_counts(state)
        op._context.strategy.load(op._original_models, op._optimizers, state, sources)
        for scheduler, sched_state in zip(op._schedulers, state.get("schedulers", [])):
            scheduler.load_state_dict(sched_state)
        op.global_step = state.get("global_step", 0)
        self._rng_base = state.get("rng_base", self._rng_base)
        op._context.precision.load_state_dict(state.get("precision") or {})
        if "operator" in state:
            op.load_state_dict(state["operator"])

    def _check_counts(self, state: Dict[str, Any]) -> None:
        op = self.operator
        parts = state.get("shards") or state.get(SHARDED_KEY) or state
        for key, have in (("models", op._original_models), ("optimizers", op._optimizers)):
            count = parts.get(key, [])  # a list, or a sharded checkpoint's count
            count = count if isinstance(count, int) else len(count)
            if count != len(have):
                raise CheckpointError(
                    f"The checkpoint has {count} {key} but "
                    f"{type(op).__name__} registered {len(have)}; load it into an operator "
                    "that registers the same components.")

    def get_models(self, to_cpu: bool = False) -> Optional[list]:
        """Rank 0's models, unwrapped and unsharded; None on other ranks (every rank calls
        it: unsharding is a collective)."""
        op = self.operator
        return op._context.strategy.full_models(op._original_models, to_cpu)

    def survivor_point(self) -> Dict[str, Any]:
        """After another rank died: whether this rank's live state is still at the last
        batch boundary (``worker/survivor.py``), and which step that is."""
        mark = self._survivor.standing(self.operator.global_step)
        why_not = None if mark else self._survivor.reason(self.operator.global_step)
        return {"step": mark.steps if mark else None, "has_buffers": self._survivor.has_buffers,
                "why_not": why_not}

    def survivor_snapshot(self, full: bool, slab: Any = None):
        """This rank's live state at the last batch boundary (``survivor_point`` said it
        stands there), as a commit: the header carries this rank's own part (position,
        step, RNGs, metric meters; small); with ``full`` the snapshot holds the models,
        optimizers and shared parts too, as rank 0's does, and rank 0's meters only, in the
        slab the driver named (``slab`` or one before) like any commit: a new object in
        Ray's store per failure is memory the store keeps."""
        mark = self._survivor.standing(self.operator.global_step)
        position = {"global_step": mark.global_step, **mark.position}
        at = mark.position
        head = {"step": mark.steps, "call_done": mark.call_done,
                "epochs_done": completed_at(at["epoch"], at["pass_done"]),
                "world_size": self.rank.world_size}
        meters = copy.deepcopy(getattr(self.operator, "_meters", None))
        own = {**head, "meters": meters,
               "state": pack_tensors(host_copies({**position, "rng": rng.get_state()}))}
        if not full:
            return {**head, "own": own}, None
        state = self._commit_state(full=True)
        state.update(position)
        self._slabs.offer(slab)
        snap = self._into_slab({**head, "state": pack_tensors(state),
                                "meters": meters if self.rank.world_rank == 0 else None})
        return {**head, "own": own, "slab_version": snap["slab_version"],
                "in_slab": snap["in_slab"]}, snap
