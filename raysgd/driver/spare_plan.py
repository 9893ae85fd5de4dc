"""Where a worker group keeps its spares. Pure: no Ray.

A spare is a warm process that holds no CPU (and no GPU) while idle, waiting to take
a dead rank's place. By default (``spare_workers=None``) a group keeps spares only where
they can warm up without taking CPU time from training: on logical CPUs the group did not
reserve (Ray's accounting, as the user declared the nodes).

- **Spares for a node.** Where nodes without a rank of the group have such CPUs (and the
  spares may take a rank on another node: CPU workers), the default keeps as many spares as
  the busiest node has ranks, spread over those nodes, one per free CPU. A lost or
  preempted node then costs what a kill costs: each of its ranks finds a warm process.
- **Otherwise one**, on a node of the group with a CPU the group did not reserve (rank 0's
  last). A node whose CPUs the group reserved in full gets none; a dead rank there is taken
  by a new process started for it alone, the survivors staying all the same.

``spare_workers=k`` keeps ``k`` wherever the group runs.
"""
from __future__ import annotations

import collections
from typing import Dict, List, Optional, Sequence

# What the default keeps at most where no node without a rank has a free CPU.
DEFAULT_MOST = 1
_EPS = 1e-9


def most(wanted: Optional[int]) -> int:
    """How many idle processes a starting group may adopt as spares: ``wanted``, or one
    (the refills at each commit then follow :func:`spare_nodes`)."""
    return DEFAULT_MOST if wanted is None else wanted


def busiest(rank_nodes: Sequence[str]) -> int:
    """The most ranks any one node holds."""
    return max(collections.Counter(rank_nodes).values(), default=0)


def spare_nodes(wanted: Optional[int], rank_nodes: List[str], reserved: Dict[str, float],
                node_cpus: Dict[str, float], anywhere: bool = True) -> List[str]:
    """One node per spare to keep.

    ``wanted``: ``spare_workers`` (None: the default); ``rank_nodes``: each rank's node;
    ``reserved``: the CPUs the group reserves per node; ``node_cpus``: every live node's
    logical CPUs; ``anywhere``: whether a spare may take a rank of another node (False on
    GPUs, where it uses the dead rank's device). Only live nodes get spares.
    """
    if not rank_nodes:
        return []
    others = sorted(set(rank_nodes) - {rank_nodes[0]})
    candidates = [node for node in others + [rank_nodes[0]] if node in node_cpus]
    if wanted is not None:
        return candidates[:1] * wanted
    room = {node: int(cpus - reserved.get(node, 0.0) + _EPS) for node, cpus in node_cpus.items()}
    if anywhere:
        for_a_node = _spread(busiest(rank_nodes), sorted(set(node_cpus) - set(rank_nodes)), room)
        if for_a_node:
            return for_a_node
    return [node for node in candidates if room[node] >= 1][:DEFAULT_MOST]


def _spread(count: int, nodes: List[str], room: Dict[str, int]) -> List[str]:
    """Up to ``count`` spares over ``nodes``, one per free CPU, round robin (the most
    nodes first, so one node's loss takes the fewest)."""
    left, out = dict(room), []
    while len(out) < count:
        step = [node for node in nodes if left[node] >= 1][:count - len(out)]
        if not step:
            break
        for node in step:
            left[node] -= 1
        out += step
    return out
