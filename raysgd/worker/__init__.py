"""Worker side: what runs inside one training process, around the user's operator.

The actor (the process's Ray boundary) around one ``WorkerRunner`` (calls, state,
snapshots, the commit hand-off), and what the runner and the operator's loops use:
loader positions, batches, the legacy hooks, process group, precision, process
state, RNGs, metric meters, timers and progress counters. Nothing here imports
``raysgd.driver``; only ``actor`` imports Ray.
"""
