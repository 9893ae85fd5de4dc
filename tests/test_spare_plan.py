"""Where a group keeps its spares (raysgd.driver.spare_plan), without Ray."""
from raysgd.driver.spare_plan import most, spare_nodes


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


def test_an_explicit_count_keeps_that_many_wherever_the_group_runs():
    assert spare_nodes(2, ["a", "b"], {"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0}) == ["b", "b"]
    assert spare_nodes(0, ["a", "b"], {}, {"a": 8.0, "b": 8.0}) == []
    assert spare_nodes(3, [], {}, {}) == []
    assert most(None) == 1 and most(0) == 0 and most(3) == 3
