"""placement.unreachable_nodes: a node whose raylet refuses connections is lost; the GCS is
asked for raylet addresses once per node, not on every check (unit tier: a fake node list)."""
import socket

from raysgd.driver import placement


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens there once the socket is closed


def test_a_refusing_raylet_is_unreachable_and_addresses_are_asked_once(monkeypatch):
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    calls = []

    def nodes():
        calls.append(1)
        return [
            {"NodeID": "live", "Alive": True, "NodeManagerAddress": "127.0.0.1",
             "NodeManagerPort": listening.getsockname()[1]},
            {"NodeID": "gone", "Alive": True, "NodeManagerAddress": "127.0.0.1",
             "NodeManagerPort": _closed_port()},
            {"NodeID": "dead", "Alive": False, "NodeManagerAddress": "127.0.0.1",
             "NodeManagerPort": 1},
        ]

    monkeypatch.setattr(placement, "_RAYLETS", {})
    monkeypatch.setattr(placement, "driver_is_ray_client", lambda: False)
    monkeypatch.setattr(placement.ray, "nodes", nodes)
    try:
        assert placement.unreachable_nodes({"live", "gone"}) == {"gone"}
        assert placement.unreachable_nodes({"live", "gone"}) == {"gone"}
        assert len(calls) == 1
        # A node Ray listed dead before its address was known is Ray's to report.
        assert placement.unreachable_nodes({"dead"}) == set()
        assert len(calls) == 2
    finally:
        listening.close()
