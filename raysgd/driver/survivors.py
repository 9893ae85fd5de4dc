"""A commit taken from the survivors' live state after a rank died (replicated strategies).

The half of recovery that decides where the state comes from. Under DDP every rank holds
the whole state, so when a rank dies inside ``train()`` the survivors' live state, where
the failed batch found it, is a newer rollback point than the last commit: the run then
re-does the batch in flight instead of every step since that commit (each survivor checks
that its state is still there, ``raysgd.worker.survivor``). The survivors hand it over as a
new commit: the full state from rank 0 when it lives, else from the lowest survivor (only
when the models hold no buffers: DDP hands rank 0's to every rank at each forward, and no
other rank has them as rank 0 had); each survivor's own part (position, metric meters)
from itself; for each dead rank the position every rank shares, with its metrics of that
call starting anew. A strategy whose ranks hold only their own shards
(``survivors_hold_state`` false) restores the commit as before.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence

import ray

from raysgd.state.commit import Commit

logger = logging.getLogger("raysgd")

# How long a survivor may take to answer; past it the commit is restored instead.
ASK_TIMEOUT_S = 30.0


def choose_source(dead: Sequence[int], points: Dict[int, dict]) -> Optional[int]:
    """The survivor whose full state stands in for rank 0's, or None (the reason logged)."""
    if 0 in dead and any(point["has_buffers"] for point in points.values()):
        logger.info("raysgd: rank 0 died and its models hold buffers, which no other rank "
                    "holds as rank 0 had them; restoring the commit")
        return None
    steps = {point["step"] for point in points.values()}
    if None in steps or len(steps) != 1:
        why = next((p["why_not"] for p in points.values() if p["step"] is None), None) or \
            f"the survivors stand at different steps {sorted(steps)}"
        logger.info("raysgd: the survivors' state cannot replace the commit: %s", why)
        return None
    return min(points)


class SurvivorCommits:
    """Mixed into :class:`raysgd.driver.worker_group.WorkerGroup`."""

    actors: List[Any]
    slabs: Any
    local_runner: Any
    use_local: bool
    num_workers: int
    settings: Any

    def survivor_commit(self, dead: Sequence[int], commit: Commit) -> Optional[Commit]:
        """A commit of the survivors' live state, newer than ``commit``; None when the
        strategy shards the state, a survivor's state moved past its last batch boundary or
        a survivor does not answer (the caller then restores ``commit``)."""
        if not self.settings.strategy.survivors_hold_state or \
                commit.world_size != self.num_workers or not dead:
            return None
        survivors = [rank for rank in range(self.num_workers) if rank not in dead]
        try:
            points = dict(zip(survivors, self._ask(survivors, "survivor_point", [()] * len(
                survivors))))
            source = choose_source(dead, points)
            if source is None or points[source]["step"] <= commit.step:
                return None
            slabs = self.slabs.targets(self.rank_nodes, self.process_keys(), [source])
            pairs = self._ask(survivors, "survivor_snapshot",
                              [(rank == source, slabs[rank]) for rank in survivors], pairs=True)
        except Exception as exc:  # noqa: BLE001 - the commit is still there to restore
            logger.info("raysgd: the survivors did not hand their state over (%r); restoring "
                        "the commit", exc)
            return None
        headers = {rank: header for rank, (header, _) in zip(survivors, pairs)}
        newcomer = ray.put({**headers[source]["own"], "meters": None})
        snapshots = [ray.put(headers[rank]["own"]) if rank in headers else newcomer
                     for rank in range(self.num_workers)]
        snapshots[0] = pairs[survivors.index(source)][1]  # the full state: rank 0's slot
        head = headers[source]
        self.slabs.consumed(source, head.get("slab_version"))
        logger.warning("raysgd: rank(s) %s died; the survivors' live state of step %d replaces "
                       "the commit of step %d", list(dead), head["step"], commit.step)
        in_slab = bool(head.get("in_slab"))  # the full state, in rank 0's place
        return Commit(head["step"], head["call_done"], self.num_workers, snapshots,
                      head["epochs_done"], (head["slab_version"],) if in_slab else (),
                      (0,) if in_slab else ())

    def _ask(self, ranks: List[int], method: str, args: List[tuple], pairs: bool = False):
        """``runner.method(*args[i])`` on each of ``ranks``, in order. With ``pairs`` the
        method returns (header, snapshot): the header is fetched, the snapshot stays in the
        object store."""
        offset = 1 if self.use_local else 0
        results: Dict[int, Any] = {}
        refs: Dict[int, Any] = {}
        snaps: Dict[int, Any] = {}
        for rank, arg in zip(ranks, args):
            if rank < offset:
                result = getattr(self.local_runner, method)(*arg)
                if pairs:
                    result = (result[0], None if result[1] is None else ray.put(result[1]))
                results[rank] = result
            elif pairs:
                refs[rank], snaps[rank] = self.actors[rank - offset].execute_pair.remote(
                    method, *arg)
            else:
                refs[rank] = self.actors[rank - offset].execute.remote(method, *arg)
        values = ray.get(list(refs.values()), timeout=ASK_TIMEOUT_S)
        for rank, value in zip(refs, values):
            results[rank] = (value, snaps[rank]) if pairs else value
        return [results[rank] for rank in ranks]
