"""Where a worker group keeps its spares. Pure: no Ray.

A spare is a warm process that holds no CPU (and no GPU) while idle, waiting to take
a dead rank's place. By default (``spare_workers=None``) a group keeps one, but only on
a node where it can warm up without taking CPU time from training: one with a logical
CPU the group did not reserve (Ray's accounting, as the user declared the node). A
node whose CPUs the group reserved in full gets none; a dead rank there is taken by
a new process started for it alone, the survivors staying all the same.
``spare_workers=k`` keeps ``k`` wherever the group runs.
"""
from __future__ import annotations

from typing import Dict, List, Optional

# What the default keeps at most (``spare_workers=None``).
DEFAULT_MOST = 1


def most(wanted: Optional[int]) -> int:
    """How many spares a group keeps at most: ``wanted``, or the default's one."""
    return DEFAULT_MOST if wanted is None else wanted


def spare_nodes(wanted: Optional[int], rank_nodes: List[str], reserved: Dict[str, float],
                node_cpus: Dict[str, float]) -> List[str]:
    """One node per spare to keep.

    ``wanted``: ``spare_workers`` (None: the default); ``rank_nodes``: each rank's node;
    ``reserved``: the CPUs the group reserves per node; ``node_cpus``: every live node's
    logical CPUs. Spares go to the group's nodes other than rank 0's first (a lost rank-0
    node then does not take them too), and only to nodes that live.
    """
    if not rank_nodes:
        return []
    others = sorted(set(rank_nodes) - {rank_nodes[0]})
    candidates = [node for node in others + [rank_nodes[0]] if node in node_cpus]
    if wanted is not None:
        return candidates[:1] * wanted
    free = [node for node in candidates
            if node_cpus[node] - reserved.get(node, 0.0) >= 1.0 - 1e-9]
    return free[:1] * DEFAULT_MOST
