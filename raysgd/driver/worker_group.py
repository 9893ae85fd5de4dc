"""``WorkerGroup``: starts, drives and stops the Ray actors of one trainer.

It reserves resources with a placement group, starts one actor per remote
rank in parallel (plus, with ``use_local``, rank 0 in the driver), sets up the
process group with rank 0's node as the rendezvous, and fans calls out
(``fanout.FanOut``: failures become typed errors).

Processes stay warm (``raysgd.driver.pool``): a group takes idle processes instead
of starting actors (CPU: any it can seat on its nodes; GPU: a crew of the same
shape), and hands its own to the pool when it stops cleanly. A dead rank is replaced
while the survivors keep their processes (``raysgd.driver.rejoin``): by a spare, a warm
actor that holds no CPU or GPU while idle, or else by a new process for that rank alone.

Ray Data inputs (``data_feed``) are split anew whenever the ranks set up or
restore a commit, and the splits are closed with the group.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from raysgd.config import RankInfo, WarmSettings, WorkerSettings
from raysgd.data.feed import DataFeed, GroupShards, log_restart
from raysgd.driver import placement, spare_plan, warm as warm_processes
from raysgd.driver.fanout import FanOut
from raysgd.driver.health import HealthMonitor
from raysgd.driver.pool import POOL, Crew
from raysgd.driver.rejoin import Rejoin
from raysgd.driver.stopping import Stopping
from raysgd.driver.survivors import SurvivorCommits
from raysgd.driver.replicas import Copiers, Landing, commit_copies, rehomed
from raysgd.driver.slabs import NO_SLABS, readable_on
from raysgd.driver.watch import CallWatch, StandingPolls
from raysgd.errors import ResourcesUnavailableError
from raysgd.state.commit import Commit, slab_commit
from raysgd.worker.actor import COMMIT_WAIT_S
from raysgd.worker.process_start import ProcessStart
from raysgd.worker.distributed import local_ranks
from raysgd.worker.runner import WorkerRunner

logger = logging.getLogger("raysgd")

RELEASE_S = 10.0  # how long a stopping worker may take to reset before it is killed


class WorkerGroup(FanOut, Rejoin, Stopping, SurvivorCommits):
    """Starts, drives and stops the workers of one trainer."""

    def __init__(self, operator_cls: type, config_for_rank: Callable[[int], dict],
                 settings: WorkerSettings, num_workers: int, use_local: bool = False,
                 initialization_hook: Optional[Callable] = None,
                 placement_timeout_s: float = 100.0,
                 reservation: Optional[placement.Reservation] = None,
                 placement_strategy: str = "PACK", workers_per_host: Optional[int] = None,
                 warm: WarmSettings = WarmSettings(), data: Optional[DataFeed] = None):
        self.operator_cls = operator_cls
        self.config_for_rank = config_for_rank
        self.settings = settings
        self.num_workers = num_workers
        self.use_local = use_local
        self.initialization_hook = initialization_hook
        self.placement_timeout_s = placement_timeout_s
        self.placement_strategy = placement_strategy  # ignored inside a reservation
        # k workers per host: one bundle of k workers' resources per host (STRICT_SPREAD).
        self.workers_per_bundle = workers_per_host or 1
        self.local_runner: Optional[WorkerRunner] = None
        self.actors: List[Any] = []
        self.warm = warm
        # The ranks' niceness (the driver's) and allocator; a bad setting raises here.
        self._process_start = ProcessStart.decide()
        self.residence = warm_processes.residence(settings, self._process_start)
        self.spares: List[warm_processes.Spare] = []  # warm processes for dead ranks' places
        self.reservation = reservation
        self.shards = GroupShards(data)  # the ranks' current Ray Data shards
        self._pg = None
        # Operators' modules its CPU processes imported (pool.code_fits; a GPU crew: its stamp).
        self._code: Dict[str, tuple] = {}
        self._nodes: List[str] = []  # each rank's node
        self._devices: List[list] = []  # each rank's accelerator ids (a spare taking it uses them)
        self._spare_plan: Optional[tuple] = None  # ((rank nodes, avoided), spare nodes)
        # Remote workers moved off a draining node: their (placement group, bundle index).
        self._moved_seats: Dict[int, tuple] = {}
        self._copies = commit_copies(settings.strategy)  # where commits get a second copy
        self.copiers = Copiers()  # who makes them (the supervisor's)
        self.slabs = NO_SLABS  # where each rank's next commit may go (the supervisor's)
        self._runners = 0  # runner generations started (a slab is named to one runner)
        self._first_bundle = 0
        self.polls = StandingPolls()  # its commit requests, which outlive their call
        # Set when the last call failed while other ranks were still inside it
        # (e.g. waiting in a collective the failed rank never joined).
        self.left_running = False
        self._threads: Optional[concurrent.futures.ThreadPoolExecutor] = None

    @property
    def num_remote(self) -> int:
        return self.num_workers - (1 if self.use_local else 0)

    # ----------------------------------------------------------------- start
    def start(self) -> List[Dict[str, Any]]:
        """Start every worker and run the operators' ``setup``; returns their summaries."""
        started = time.perf_counter()
        try:
            summaries = self._set_up(self._create_workers())
        except BaseException:
            self.shutdown(force=True)
            raise
        logger.info("raysgd: %d worker(s) ready in %.1fs", self.num_workers,
                    time.perf_counter() - started)
        return summaries

    def _set_up(self, infos: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Runners, process group and operators on workers that run nothing yet."""
        self._start_runners(infos)
        if self.num_workers > 1:
            port = self.execute_single(0, "create_store", infos[0]["host"])
            self.execute("setup_process_group", infos[0]["host"], port)
        summaries = self.execute("setup_operator")
        self._nodes = [info["node_id"] for info in infos]
        self._devices = [info.get("devices", []) for info in infos]
        self.shards.registered = summaries[0].get("ray_datasets", {})
        for summary in summaries:
            summary.pop("ray_datasets", None)
        self.attach_data(summaries)
        return summaries

    def attach_data(self, summaries: Optional[List[Dict[str, Any]]] = None) -> None:
        """Give every rank new streaming shards of the Ray Data inputs (the old split is
        closed); ``summaries`` then say the ranks have those loaders."""
        slots = self.shards.renew(self._nodes, lambda per_rank: self.execute_per_rank(
            "attach_data", [(shards,) for shards in per_rank]))
        for summary in summaries or []:
            summary.update({f"has_{slot}_loader": True for slot in slots})

    def _create_workers(self) -> List[Dict[str, Any]]:
        infos = [self._local_info()] if self.use_local else []
        if not self.num_remote:
            return infos
        placement.ensure_ray()
        if not self.residence.keeps_group:
            self._reserve()
            nodes = self._worker_nodes()
            if not self.warm.reuse:
                return infos + self._start([None] * len(nodes), nodes)
            taken = warm_processes.take_beside(nodes, spare_plan.most(self.warm.spares),
                                               self.operator_cls, self._crew_key())
            self.spares, self._code = taken.spares, taken.code
            return infos + self._start(taken.seated, nodes)
        adopted = warm_processes.take_crew(self._crew_key(), spare_plan.most(self.warm.spares)) \
            if self.warm.reuse else None
        if adopted is not None:
            (self.actors, self.spares, self._pg), found = adopted
            return infos + found
        POOL.release_held()  # idle GPU crews of another shape hold what this group needs
        self._reserve()
        return infos + self._start([None] * self.num_remote, self._worker_nodes())

    def _start(self, seated: List[Any], nodes: List[str]) -> List[Dict[str, Any]]:
        """New processes for the seats no idle one took (None in ``seated``)."""
        group, bundle = self._group(), self._bundle()
        self.actors = [self.residence.actor(group, self._bundle_index(i), bundle, nodes[i])
                       if actor is None else actor for i, actor in enumerate(seated)]
        return self._get([a.node_info.remote() for a in self.actors], offset=self._first_remote)

    @property
    def _first_remote(self) -> int:
        """The rank of the first remote worker (rank 0 lives in the driver with use_local)."""
        return 1 if self.use_local else 0

    # ------------------------------------------------------------ warm pool
    def _crew_key(self) -> tuple:
        """CPU workers serve any CPU trainer; a GPU crew, only one of its shape and code;
        either, only one whose processes start as its own (their allocator is for life)."""
        if not self.residence.keeps_group:
            return warm_processes.beside_key(self._process_start)
        where = (self.placement_strategy,) if self.reservation is None else \
            (self.reservation.group.id, self.reservation.first_bundle)
        return (tuple(sorted(self._bundle().items())), self.num_remote, self.workers_per_bundle,
                where, warm_processes.code_stamp(self.operator_cls),
                self._process_start.allocator())

    def _hand_to_pool(self) -> bool:
        """Reset every worker and give them to the pool; False when one would not reset."""
        try:
            ray.get([a.release.remote() for a in self.actors], timeout=RELEASE_S)
        except (RayActorError, RayTaskError, GetTimeoutError) as exc:
            logger.warning("raysgd: a worker did not reset for reuse (%s); stopping them", exc)
            return False
        kept, held = None, {}
        if self.residence.keeps_group and self._pg is not None:
            kept, self._pg = self._pg, None
            held = {key: sum(b[key] for b in self._bundles()) for key in self._bundle()}
        POOL.give(Crew(placement.ray_session(), self._crew_key(), self.actors, self.spares,
                       kept, held, stop=warm_processes.stop_crew, code=self._code))
        self.actors, self.spares = [], []
        return True

    def _local_info(self) -> Dict[str, Any]:
        if ray.is_initialized():
            return {"node_id": ray.get_runtime_context().get_node_id(),
                    "host": ray.util.get_node_ip_address(), "pid": os.getpid()}
        return {"node_id": "local", "host": "127.0.0.1", "pid": os.getpid()}

    def _bundle(self) -> Dict[str, float]:
        bundle = {"CPU": float(self.settings.num_cpus_per_worker)}
        if self.settings.use_gpu:
            bundle["GPU"] = float(self.settings.num_gpus_per_worker)
        return bundle

    def _bundles(self) -> List[Dict[str, float]]:
        return placement.host_bundles(self._bundle(), self.num_remote, self.workers_per_bundle)

    def _reserve(self) -> None:
        """Reserve this group's bundles (within a Tune trial's, with a reservation)."""
        placement.ensure_ray()
        bundles = self._bundles()
        if self.reservation is not None:
            if len(bundles) > self.reservation.size:
                raise ResourcesUnavailableError(
                    f"{self.num_remote} worker(s) do not fit the {self.reservation.size} bundle(s) "
                    "reserved for them.")
            self._first_bundle = self.reservation.first_bundle
            return
        placement.check_can_ever_place(bundles[0], len(bundles), self.placement_strategy)
        self._pg = placement.reserve(bundles[0], len(bundles), self.placement_timeout_s,
                                     self.placement_strategy)

    def _group(self):
        return self.reservation.group if self.reservation is not None else self._pg

    def _bundle_index(self, worker: int) -> int:
        return self._first_bundle + worker // self.workers_per_bundle

    def _seat(self, worker: int) -> tuple:
        """(placement group, bundle index) of a remote worker's reservation."""
        return self._moved_seats.get(worker) or (self._group(), self._bundle_index(worker))

    def _worker_nodes(self) -> List[str]:
        """The node of each remote worker's bundle."""
        seats = [self._seat(i) for i in range(self.num_remote)]
        nodes = {id(group): placement.bundle_nodes(group) for group, _ in seats}
        # A bundle Ray is placing anew (its node died) has no node yet.
        return [nodes[id(group)].get(index, "") for group, index in seats]

    @property
    def rank_nodes(self) -> List[str]:
        """The node each rank runs on."""
        return list(self._nodes)

    def _start_runners(self, infos: List[Dict[str, Any]]) -> None:
        self._runners += 1  # every rank's runner is new: no slab named before is held
        local = local_ranks([info["node_id"] for info in infos])
        kwargs = [{"operator_cls": self.operator_cls, "config": self.config_for_rank(rank),
                   "settings": self.settings,
                   "rank": RankInfo(rank, local[rank], self.num_workers)}
                  for rank in range(self.num_workers)]
        remote_kwargs = kwargs[1:] if self.use_local else kwargs
        # A remote rank's commits are return values Ray stores before the driver sees them,
        # so they may view the live state (worker/live_state.py); a local rank's may not.
        remote_extra = {"num_threads": max(1, int(self.settings.num_cpus_per_worker)),
                        "commit_wait_s": COMMIT_WAIT_S, "commit_views": True}
        refs = [actor.start.remote(self.initialization_hook, {**kw, **remote_extra},
                                   self._process_start.niceness)
                for actor, kw in zip(self.actors, remote_kwargs)]
        if self.use_local:
            if self.initialization_hook:
                self.initialization_hook()
            self.local_runner = WorkerRunner(**kwargs[0])
        self._get(refs, offset=1 if self.use_local else 0)

    # --------------------------------------------------------------- commits
    def execute_pair(self, method: str, *args, watch: Optional[CallWatch] = None):
        """Call a runner method returning (header, snapshot) on every rank; a remote rank
        gets one more argument, the slab its snapshot may go to (``slabs``).

        Returns the headers and a :class:`Commit` of the snapshots, which stay
        in the object store (owned by the driver, not on its heap).
        """
        runner = self.local_runner
        offset = 1 if runner is not None else 0
        slabs = self.slabs.targets(self._nodes, self.process_keys())
        pairs = [actor.execute_pair.remote(method, *args, slabs[rank + offset])
                 for rank, actor in enumerate(self.actors)]
        local_future = None if runner is None else self._run_local(getattr(runner, method), *args)
        headers = self._gather([h for h, _ in pairs], offset, local_future, True, watch)
        snapshots = [snap for _, snap in pairs]
        if self.local_runner is not None:
            headers[0], local_snap = headers[0]
            snapshots.insert(0, ray.put(local_snap) if ray.is_initialized() else local_snap)
        self.slabs.used(headers)
        return headers, slab_commit(headers[0]["step"], headers[0]["call_done"],
                                    self.num_workers, snapshots,
                                    headers[0].get("epochs_done", 0), headers)

    def process_keys(self) -> List[Any]:
        """Per rank, its runner (a survivor's new one holds no slab): ``slabs`` keys on it."""
        local = [f"local/{self._runners}"] if self.local_runner is not None else []
        return local + [f"{actor._actor_id.hex()}/{self._runners}" for actor in self.actors]

    def copy_commit(self, commit: Commit) -> Landing:
        """Start copying ``commit``'s parts that a lost node could take to another node."""
        return self._copies(commit.snapshots, self._nodes, self.actors, self._first_remote,
                            self.copiers, commit.slab_ranks)

    def snapshot(self) -> Commit:
        """Commit now, between calls."""
        return self.execute_pair("snapshot_pair")[1]

    def restore(self, commit: Commit, renew_shards: bool = False) -> None:
        """Load ``commit`` into every rank (each its own part when the size is unchanged;
        otherwise every old rank's part: a sharded state is cut anew from the old shards).

        ``renew_shards``: the ranks read batches past the commit, so their Ray Data
        shards are split anew first (a stream cannot be rewound; freshly set-up ranks
        have new shards already).
        """
        commit = dataclasses.replace(commit, snapshots=rehomed(commit.snapshots))
        same, readable = commit.world_size == self.num_workers, readable_on(self._nodes, commit)
        args = [(snaps[0], snaps[rank]) if same else (snaps[0], None, *snaps)
                for rank, snaps in enumerate(readable)]
        if renew_shards:
            self.attach_data()
        restarted = self.execute_per_rank("restore", args)
        if any(restarted) and not renew_shards:
            # A rank whose position had moved restarts its pass; the others must too, and on
            # new shards (the coordinator starts a pass only when every rank asks for one).
            self.attach_data()
            restarted = self.execute_per_rank("restore", args)
        restarted = next(filter(None, restarted), None)
        logger.info("raysgd: restored the commit of step %d on %d worker(s)", commit.step,
                    self.num_workers)
        log_restart(restarted)

    def watch(self, timeout_s: float, committed_step: int, on_commit=None,
              on_progress=None, on_tick=None) -> CallWatch:
        return CallWatch(self, HealthMonitor(self.num_workers, timeout_s), committed_step,
                         on_commit, ticket=self.polls.next_ticket(), on_progress=on_progress,
                         on_tick=on_tick)

    def placeable_workers(self, want: int = 0) -> int:
        """Workers of this group's shape that fit in the cluster now (remote ones)."""
        if not ray.is_initialized():
            return 0
        POOL.release_held()  # a running trainer needs them more than idle workers do
        if self.reservation is not None:
            return self.reservation.size  # ours alone; a dead worker's bundle comes back
        return placement.placeable_workers(self._bundle(), want=want)

    @staticmethod
    def cluster_gpus() -> float:
        return placement.cluster_gpus()

    # --------------------------------------------------------------- shutdown
    def shutdown(self, force: bool = False) -> None:
        """Stop every worker: hand them to the pool (``warm.reuse``), or kill them.

        With ``force`` kill them without a clean teardown (and without waiting for Ray to
        show their resources free again: recovery must not wait for a lost node's resources).
        Workers still inside a call (``left_running``) are never reused.
        """
        # A GPU crew keeps one placement group; workers moved into others are not kept.
        moved_gpu = self.residence.keeps_group and bool(self._moved_seats)
        reusable = self.warm.reuse and not force and not self.left_running and not moved_gpu
        if self.actors and reusable and ray.is_initialized() and not self._hand_to_pool():
            force = True  # a worker that would not reset will not stop cleanly either
        for spare in self.spares:
            warm_processes.kill(spare.actor)
        self.spares = []
        self.shards.close()
        wait_for_release = self._pg is not None and not force
        available = ray.available_resources() if wait_for_release else {}
        if not force and self.actors:
            try:
                ray.get([a.execute.remote("shutdown") for a in self.actors], timeout=10)
            except (RayActorError, RayTaskError, GetTimeoutError):
                logger.warning("raysgd: a worker did not shut down cleanly; killing it")
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.local_runner is not None:
            self.local_runner.shutdown()
            self.local_runner = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        if self._pg is not None:
            freed = {key: sum(b[key] for b in self._bundles()) for key in self._bundle()}
            placement.release(self._pg, {k: available.get(k, 0.0) + v for k, v in freed.items()}
                              if wait_for_release else None)
            self._pg = None
        for group in {id(g): g for g, _ in self._moved_seats.values()}.values():
            placement.release(group)
        self._moved_seats = {}
