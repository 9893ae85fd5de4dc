"""Driver side: what runs in the driver process to keep a crew of workers training.

The supervisor (commits, recovery, rollback, resize, with the recovery policy)
over the worker group, which is the Ray boundary: placement, fan-out, watch and
health checks, warm workers and their pool. Beside them, the run recorder (disk
checkpoints and loggers), progress bars and the trainer's argument checks. Driver
code may use worker code (a ``use_local`` rank 0 runs a ``WorkerRunner`` here);
worker code never imports this package.
"""
