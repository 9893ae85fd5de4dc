"""Where a group keeps its spares (raysgd.driver.spare_plan), without Ray."""
from raysgd.driver.spare_plan import busiest, most, spare_nodes


def test_the_default_keeps_one_spare_only_on_a_node_with_an_unreserved_cpu():
    # Two workers of 1 CPU on a 4-CPU node: two CPUs are free, the spare goes there.
    assert spare_nodes(None, ["a", "a"], {"a": 2.0}, {"a": 4.0}) == ["a"]
    # Every CPU of the node is reserved by the workers: no spare (a new process replaces).
    assert spare_nodes(None, ["a", "a"], {"a": 2.0}, {"a": 2.0}) == []
    # Less than one CPU left is not a CPU for a spare.
    assert spare_nodes(None, ["a"], {"a": 1.5}, {"a": 2.0}) == []


def test_the_default_prefers_a_node_other_than_rank_0s_and_skips_full_ones():
    nodes = ["head", "w1", "w2"]
    reserved = {"head": 2.0, "w1": 2.0, "w2": 1.0}
    assert spare_nodes(None, nodes, reserved, {"head": 4.0, "w1": 2.0, "w2": 2.0}) == ["w2"]
    # Only rank 0's node has room: the spare goes there.
    assert spare_nodes(None, nodes, reserved, {"head": 4.0, "w1": 2.0, "w2": 1.0}) == ["head"]
    # A node that died (no longer in the live nodes' CPUs) gets none.
    assert spare_nodes(None, nodes, reserved, {"head": 2.0, "w1": 2.0}) == []


def test_the_default_keeps_spares_for_the_busiest_node_on_nodes_without_ranks():
    # The chaos cluster: a CPU-less head, both ranks on node a, nodes b and c free.
    cpus = {"head": 0.0, "a": 2.0, "b": 2.0, "c": 2.0}
    assert spare_nodes(None, ["a", "a"], {"a": 2.0}, cpus) == ["b", "c"]
    # One node free: both spares on it, one per free CPU.
    assert spare_nodes(None, ["a", "a"], {"a": 2.0}, {"a": 2.0, "b": 2.0}) == ["b", "b"]
    # It has room for one only: one (a lost node then gets one warm and one new process).
    assert spare_nodes(None, ["a", "a"], {"a": 2.0}, {"a": 2.0, "b": 1.0}) == ["b"]
    # Ranks spread one per node: one spare, on the node without a rank.
    assert spare_nodes(None, ["a", "b"], {"a": 1.0, "b": 1.0},
                       {"a": 2.0, "b": 2.0, "c": 2.0}) == ["c"]
    # Three ranks on a, one on b: three spares over c and d.
    assert spare_nodes(None, ["a", "a", "a", "b"], {"a": 3.0, "b": 1.0},
                       {"a": 4.0, "b": 4.0, "c": 2.0, "d": 1.0}) == ["c", "d", "c"]


def test_the_default_falls_back_to_the_groups_nodes_when_no_other_node_has_room():
    # Node b has no free CPU (reserved by this group's moved bundle): the group's rule.
    assert spare_nodes(None, ["a", "a"], {"a": 2.0, "b": 1.0}, {"a": 3.0, "b": 1.0}) == ["a"]
    # GPU spares only take a rank of their own node: never on a node without ranks.
    assert spare_nodes(None, ["a", "a"], {"a": 2.0}, {"a": 4.0, "b": 8.0},
                       anywhere=False) == ["a"]
    assert spare_nodes(None, ["a", "a"], {"a": 2.0}, {"a": 2.0, "b": 8.0},
                       anywhere=False) == []


def test_an_explicit_count_keeps_that_many_wherever_the_group_runs():
    assert spare_nodes(2, ["a", "b"], {"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}) == ["b", "b"]
    assert spare_nodes(0, ["a", "b"], {}, {"a": 8.0, "b": 8.0}) == []
    assert spare_nodes(3, [], {}, {}) == []
    assert most(None) == 1 and most(0) == 0 and most(3) == 3
    assert busiest(["a", "b", "a"]) == 2 and busiest([]) == 0
