"""``WorkerRunner``: one operator in one process. No Ray here.

The same class runs inside a Ray actor and, with ``use_local=True``, in the
driver. It owns the process group, the device, the precision object, the
position in the train loader and the worker's full state.
"""
from __future__ import annotations

import copy
import dataclasses
import threading
import time
from typing import Any, Callable, Dict, Optional

import torch

from raysgd.commits.interval import CallCost
from raysgd.config import RankInfo, WorkerSettings
from raysgd.constants import BATCH_SIZE
from raysgd.data.dataset_config import is_ray_dataset
from raysgd.data.shards import shard_loaders
from raysgd.errors import ConfigError
from raysgd.operator import OperatorContext, TrainingOperator
from raysgd.state.packing import pack_tensors, unpack_tensors
from raysgd.state.slab import SlabTarget
from raysgd.worker import distributed, malloc_arena, rng, step_seeds
from raysgd.worker.batches import batch_count
from raysgd.worker.hooks import EpochCaller, call_info
from raysgd.worker.passes import Passes
from raysgd.worker.precision import create_precision
from raysgd.worker.progress import BatchEvents, thread_line
from raysgd.worker.rank_commits import RankCommits
from raysgd.worker.slab_writer import SlabWriter
from raysgd.worker.returns import call_metrics
from raysgd.worker.runner_state import RunnerState
from raysgd.worker.staging import NoStaging, create_staging
from raysgd.worker.stop_point import StopHere, StopPoint
from raysgd.worker.strategy import create_strategy
from raysgd.worker.survivor import SurvivorPoint
from raysgd.worker.timers import NULL_TIMERS, TimerCollection


WHERE_AFTER_S = 0.5  # idle this long before a progress report says where the rank is
SAME = "same"  # train_and_commit's commit_every when the call keeps the runner's interval


def _unpacked(state: Dict[str, Any]) -> Dict[str, Any]:
    """A packed commit part as tensors, but for its shards (``raysgd.state.chunks`` reads
    those packed)."""
    return {key: value if key == "shards" else unpack_tensors(value)
            for key, value in state.items()}


class WorkerRunner(RunnerState):
    """Builds one operator and runs its train/validate hooks on request."""

    def __init__(self, operator_cls: type, config: Dict[str, Any], settings: WorkerSettings,
                 rank: RankInfo, num_threads: Optional[int] = None,
                 commit_every: Optional[int] = None, commit_wait_s: float = 0.0,
                 commit_views: bool = False):
        if num_threads:
            torch.set_num_threads(num_threads)
        self.operator_cls = operator_cls
        self.config = config
        self.settings = settings
        self.rank = rank
        self.device = distributed.choose_device(settings.use_gpu)
        self.operator: Optional[TrainingOperator] = None
        self._store = None
        self._passes: Optional[Passes] = None
        self._val_passes: Optional[Passes] = None
        self._train_epoch: Optional[EpochCaller] = None
        self.commit_every = commit_every
        self.last_cost: Optional[CallCost] = None  # what commits cost the last train() call
        # In-epoch commits on their way to the driver; ``commit_views``: they view the
        # parameters and optimizer state instead of copying them (worker/live_state.py).
        self._commits = RankCommits(commit_wait_s, commit_views)
        self._slabs = SlabWriter()  # commits into the slabs the driver names (state/slab.py)
        self._call_done_base = 0
        self._last_progress = time.monotonic()
        self.events = BatchEvents()  # the running call's counters, for the driver's progress bar
        self._thread: Optional[int] = None
        self.first_step_wall: Optional[float] = None  # wall time of the first step after a restore
        self._staging = NoStaging()  # sharded disk checkpoints, once the operator exists
        self.stop_point = StopPoint()  # a step every rank stops at for a hand-over
        # Whether this rank's live state is still at the last batch boundary (a survivor's
        # state then stands in for the commit after another rank died).
        self._survivor = SurvivorPoint()
        self._rng_base = 0  # every step's RNG seeds derive from it (worker/step_seeds.py)

    # ---------------------------------------------------------------- set-up
    def create_store(self, host: str) -> int:
        """Rank 0 only: open the rendezvous store and return its port."""
        self._store = distributed.create_store(host, self.rank.world_size, self.settings.timeout_s)
        return self._store.port

    def setup_process_group(self, host: str, port: int) -> None:
        if self.rank.distributed:
            distributed.init_process_group(self.settings.backend, self.rank, host, port,
                                           distributed.collective_timeout(self.settings.timeout_s),
                                           store=self._store)

    def setup_operator(self) -> Dict[str, Any]:
        """Construct the operator (runs its ``setup``) and report what it registered."""
        precision = create_precision(self.settings.use_fp16, self.device, self.settings.apex_args)
        strategy = create_strategy(self.settings.strategy, self.rank, self.device, precision,
                                   self.settings.wrap_ddp)
        context = OperatorContext(self.rank, self.device, self.settings, precision, self.events,
                                  strategy)
        self.operator = self.operator_cls(self.config, context)
        self._staging = create_staging(self.settings.staged_disk, self.rank.world_rank)
        if not self.operator._registered:
            raise ConfigError(
                f"{self.operator_cls.__name__}.setup() did not call self.register(models=..., "
                "optimizers=...); register at least one model and one optimizer there.")
        loaders = {"train": self.operator.train_loader,
                   "validation": self.operator.validation_loader}
        # A registered ray.data.Dataset is split by the driver and comes back through
        # attach_data; until then there is nothing to iterate.
        datasets = {slot: ds for slot, ds in loaders.items() if is_ray_dataset(ds)}
        self._passes = Passes(None if "train" in datasets else loaders["train"])
        # validate(num_steps=k) continues where the previous one stopped, as legacy did.
        self._val_passes = Passes(None if "validation" in datasets else loaders["validation"],
                                  "validation loader", allow_empty=True)
        self._train_epoch = EpochCaller(self.operator)
        self._commits.attach(self.operator._optimizers)
        self._survivor.attach(strategy, self.operator._original_models, self.operator._optimizers)
        self._rng_base = distributed.from_rank_0(step_seeds.base_from_rng(), self.rank)
        return {"has_train_loader": loaders["train"] is not None,
                "has_validation_loader": loaders["validation"] is not None,
                "validation_missing": None if loaders["validation"] is not None else getattr(
                    self.operator, "missing_validation_message", None),  # the operator's why
                "num_models": len(self.operator._models),
                # Only rank 0's datasets are split; the others need not travel.
                "ray_datasets": datasets if self.rank.world_rank == 0 else {}}

    def attach_data(self, shards: Dict[str, Any]) -> None:
        """This rank's streaming shards (``{slot: (DataIterator, DatasetConfig)}``) become
        its loaders; the pass in progress, if any, is abandoned."""
        loaders = shard_loaders(shards, self.config.get(BATCH_SIZE), self.device)
        if "train" in loaders:
            self.operator._train_loader = loaders["train"]
            self._passes.use_loader(loaders["train"])
        if "validation" in loaders:
            self.operator._validation_loader = loaders["validation"]
            self._val_passes.use_loader(loaders["validation"])

    # -------------------------------------------------------------- training
    def train_epoch(self, num_steps: Optional[int] = None, profile: bool = False,
                    info: Optional[dict] = None, resume: bool = False) -> Dict[str, Any]:
        """One ``train()`` call; ``resume`` finishes a call cut short by a failure."""
        operator = self.operator
        if operator.train_loader is None:
            raise ConfigError("train() needs a train loader: call "
                              "self.register_data(train_loader=...) in setup().")
        operator.timers = TimerCollection(window_size=None) if profile else NULL_TIMERS
        self._begin_call()
        start = time.perf_counter()
        if not resume:
            self._call_done_base, operator._resume_meters = 0, None
        epoch_idx = self._passes.epoch  # passes started before this call
        info = call_info(info, num_steps, epoch_idx, self.settings)
        iterator = self._passes.take(num_steps, self._before_batch, resume=resume)
        self.events.begin("train", batch_count(iterator, self._call_done_base), self._call_done_base)
        metrics = call_metrics(self._train_epoch(iterator, info, num_steps, epoch_idx), operator,
                               "train_epoch")
        self._note_first_step(iterator.done)
        self._commits.settle()  # the call's end: no commit may view what the next call changes
        self._survivor.clear()
        result = {"epoch": self._passes.epoch, **metrics}
        took, commits = time.perf_counter() - start, self._commits.stats()
        self.last_cost = CallCost(iterator.done, took, commits["commits"],
                                  commits["commit_hold_s"])
        if profile:
            result["profile"] = {**operator.timers.stats(), **commits, "train_epoch_s": took,
                                 "commit_interval": self.commit_every}
        operator.timers = NULL_TIMERS
        return result

    def validate(self, num_steps: Optional[int] = None, profile: bool = False,
                 info: Optional[dict] = None) -> Dict[str, Any]:
        operator = self.operator
        if operator.validation_loader is None:  # an operator may say why in its own terms
            raise ConfigError(getattr(operator, "missing_validation_message", None) or
                              "validate() needs a validation loader: call "
                              "self.register_data(validation_loader=...) in setup().")
        operator.timers = TimerCollection(window_size=None) if profile else NULL_TIMERS
        self._begin_call()
        start = time.perf_counter()
        info = call_info(info, num_steps, self._passes.epoch, self.settings)
        passes = self._val_passes
        take = passes.take if passes.replayable else passes.take_new_pass
        iterator = take(num_steps, self._tick)
        self.events.begin("validate", batch_count(iterator))
        # Validation must not move the training RNGs (its loader draws a seed),
        # so a run trains the same however often it validates, and a commit
        # taken after train() is still exact after validate().
        rng_before = rng.get_state()
        try:
            result = call_metrics(operator.validate(iterator, info), operator, "validate")
        finally:
            rng.set_state(rng_before)
        if profile:
            result["profile"] = {**operator.timers.stats(),
                                 "validation_s": time.perf_counter() - start}
        operator.timers = NULL_TIMERS
        return result

    def train_and_commit(self, num_steps: Optional[int] = None, profile: bool = False,
                         info: Optional[dict] = None, resume: bool = False, ticket: int = 0,
                         commit_every: Any = SAME, slab: Optional[SlabTarget] = None):
        """``train_epoch`` and the commit of its end state (into ``slab`` if given),
        returned together; or, when the ranks agreed to stop at a step (``stop_point``),
        that step's commit (``stopped``). ``ticket``: the driver's call, whose commit
        requests alone may take this call's in-epoch commits (``CommitHandoff.begin``);
        ``commit_every``: this call's interval (``raysgd.commits.interval``), the same on
        every rank. The header's ``cost`` says what commits cost this rank in the call."""
        if commit_every != SAME:
            self.commit_every = commit_every
        self._commits.handoff.begin(ticket)
        self._slabs.offer(slab)
        self.stop_point.open(self._passes.steps)
        try:
            metrics = self.train_epoch(num_steps, profile, info, resume)
        except StopHere as stop:
            snap = stop.snapshot
            return {"step": snap["step"], "call_done": snap["call_done"], "stopped": True,
                    "epochs_done": snap["epochs_done"], "metrics": None,
                    "first_step_wall": self.first_step_wall}, snap
        finally:
            self.stop_point.close()
        started = time.perf_counter()
        header, snap = self.snapshot_pair()
        self.last_cost = dataclasses.replace(self.last_cost, end_s=time.perf_counter() - started)
        malloc_arena.trim()  # what the call freed in the heap's middle (after a failure: MBs)
        return {**header, "metrics": metrics, "first_step_wall": self.first_step_wall,
                "cost": self.last_cost}, snap

    def snapshot_pair(self, slab: Optional[SlabTarget] = None):
        """A commit between calls: a small header and the snapshot (its tensors in the slab
        the driver named, ``slab`` or one named before: ``raysgd.state.slab``)."""
        self._slabs.offer(slab)
        snap = self._into_slab(self.snapshot())
        return {"step": snap["step"], "call_done": 0, "epochs_done": snap["epochs_done"],
                "slab_version": snap["slab_version"], "in_slab": snap["in_slab"]}, snap

    def _into_slab(self, snap: Dict[str, Any]) -> Dict[str, Any]:
        """``snap`` with its packed state copied into the slab the driver named, if any
        (``slab_version``: the named slab it used up; ``in_slab``: whether it is there)."""
        state, version, wrote = self._slabs.write_pending(snap["state"])
        return {**snap, "state": state, "slab_version": version, "in_slab": wrote}

    def update_scheduler(self, metric: Any) -> None:
        for scheduler in self.operator._schedulers:
            if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                scheduler.step(metric)
            else:
                scheduler.step()

    # ------------------------------------------------------ commits, progress
    def snapshot(self, call_done: int = 0) -> Dict[str, Any]:
        """A commit of this rank: full state on rank 0, the rank's own part elsewhere."""
        meters = getattr(self.operator, "_meters", None)
        state = self._commit_state()
        self._stage(state, call_end=not call_done)
        return {"step": self._passes.steps, "call_done": call_done,
                "epochs_done": self._passes.completed,
                "world_size": self.rank.world_size,
                "state": pack_tensors(state),
                "meters": copy.deepcopy(meters) if call_done else None}

    def _stage(self, state: Dict[str, Any], call_end: bool, keep_existing: bool = False) -> None:
        op = self.operator
        self._staging.stage(self._passes.steps, call_end, state, lambda path: op._context.
                            strategy.save_sharded(op._original_models, op._optimizers, path),
                            keep_existing)

    def stage_now(self) -> None:
        """Stage a sharded checkpoint of this step off schedule (the driver's node drains)."""
        self._stage(self._commit_state(), call_end=True, keep_existing=True)

    def staged_files(self, step: int, by_path: bool = False, with_version: bool = False) -> Any:
        """This rank's files for the checkpoint of ``step`` (``raysgd.worker.staging``)."""
        return self._staging.staged_files(step, by_path, with_version)

    def staged_version(self, step: int) -> Optional[int]:
        return self._staging.staged_version(step)

    def hold_staged(self, step: int) -> None:
        """Keep ``step``'s staged files until the driver's writer holds another step."""
        self._staging.hold(step)

    def restore(self, primary: Dict[str, Any], own: Optional[Dict[str, Any]] = None,
                *peers: Dict[str, Any]) -> Optional[Dict[str, int]]:
        """Load a commit: rank 0's snapshot, plus this rank's own when the world size is
        unchanged, else (``peers``) every old rank's, whose shards a sharding strategy cuts
        its new piece from. Returns ``{"epoch", "batches"}`` when a pass that cannot be
        replayed (Ray Data input) restarts from its beginning instead, else None."""
        state = _unpacked(primary["state"])
        if own is not None and own is not primary:
            state.update(_unpacked(own["state"]))
        # Shards stay packed: each rank reads only the rows it keeps, without copying the rest.
        sources = [snap["state"] for snap in ([own] if own is not None else peers or [primary])]
        self.load_state_dict(state, sources)
        restarted = self._passes.restarted
        # A restarted pass reads its first batches again; metrics counted before the
        # commit would count them twice, so the call's metrics start over.
        self.operator._resume_meters = None if restarted else (own or {}).get("meters")
        self._call_done_base = primary["call_done"]
        self.first_step_wall = None
        self._commits.clear()
        self._survivor.clear()
        self.stop_point.close()
        malloc_arena.trim()  # what the old state and the unpacked commit left in the heap
        return restarted

    def next_commit(self, after: int, wait_s: float = 0.0, ticket: int = 0,
                    slab: Optional[SlabTarget] = None) -> Optional[Dict[str, Any]]:
        """The next in-epoch commit newer than ``after`` (the driver's long poll), copied
        into the slab the driver named (``slab`` or one named before) if there is one: on
        the commits thread, while the training thread runs the next forward and backward
        (the optimizer's next step waits for the driver to have it, ``live_state``)."""
        self._slabs.offer(slab)
        snap = self._commits.handoff.take(after, wait_s, ticket)
        return None if snap is None else self._into_slab(snap)

    def progress(self) -> Dict[str, Any]:
        """Liveness report for the driver's hang detection (control thread)."""
        idle = time.monotonic() - self._last_progress
        # Walking the training thread's stack costs CPU; only a stalled rank needs it.
        where = thread_line(self._thread) if idle >= WHERE_AFTER_S else "making progress"
        return {"steps": self._passes.steps if self._passes else 0, "idle_s": idle,
                "first_step_wall": self.first_step_wall, "where": where,
                "call": self.events.report()}

    def _begin_call(self) -> None:
        self._thread = threading.get_ident()
        self._last_progress = time.monotonic()
        self._commits.begin_call()

    def _tick(self, done: int = 0) -> None:
        self._last_progress = time.monotonic()
        self.events.fetched_batch()

    def _before_batch(self, done: int) -> None:
        self._tick()
        self._note_first_step(done)
        steps = self._passes.steps
        step_seeds.seed_step(self._rng_base, self.rank.world_rank, steps)
        call_done = self._call_done_base + done
        if self.stop_point.at_boundary(self._passes.steps):
            raise StopHere(self.snapshot(call_done))
        waited = self._commits.before_batch(steps)
        if done and self._commits.due(self._passes.steps, self.commit_every):
            self._commits.offer(self._passes.steps, lambda: self.snapshot(call_done))
            waited = True
        if waited:
            self._last_progress = time.monotonic()  # waiting for the driver is not a hang
        self._survivor.mark(steps, self._passes.state_dict, self.operator.global_step, call_done)

    def _note_first_step(self, done: int) -> None:
        if done and self.first_step_wall is None:
            self.first_step_wall = time.time()

    # ----------------------------------------------------------------- misc
    def apply(self, fn: Callable[[], Any]) -> Any:
        return fn()

    def apply_operator(self, fn: Callable[[TrainingOperator], Any]) -> Any:
        return fn(self.operator)

    def shutdown(self) -> None:
        self._commits.close()
        for passes in (self._passes, self._val_passes):
            if passes is not None:
                passes.close()
        self.operator = None
        self._passes = self._val_passes = self._train_epoch = None
        self._staging.close()
        self._slabs.close()
        distributed.destroy_process_group()
        self._store = None
