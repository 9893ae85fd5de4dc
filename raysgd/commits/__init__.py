"""The commit path: how a rank's state becomes a commit the driver can restore.

``rules``: the protocol's decisions as data (as grown, as run today, and the target design's);
``protocol``: the driver's side as a pure state machine. ``tests/commit_sim.py`` plays
seeded fault schedules against it and checks the invariants after every event.
"""
