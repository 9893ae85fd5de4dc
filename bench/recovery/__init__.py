"""Recovery benchmark: kill one of 2 workers mid-epoch and measure what it costs.

``python -m bench.recovery [--quick] [--out PATH]`` (or ``python -m bench --recovery``)
runs, each as its own subprocess with repetitions in rotating order:

* ``raysgd_recovery``: raysgd ``TorchTrainer`` (2 workers) on the bench workload;
  one worker is SIGKILLed mid-epoch; ``train()`` recovers from the last commit;
* ``raytrain_recovery``: Ray Train 2.x ``TorchTrainer`` (2 workers) with
  ``FailureConfig(max_failures=3)`` and a checkpoint reported every epoch,
  killed the same way;
* ``raysgd_commit_*``: steady raysgd throughput with no in-epoch commits, the
  default commit interval and a denser one (the cost of commits, no failure).

See ``bench/README.md`` ("Recovery benchmark") for the figures and targets.
"""


def kill_step(steps_per_epoch: int) -> int:
    """The global step at which a worker is killed: three quarters into the 2nd epoch.

    The first epoch is warm-up and ends with a commit (raysgd) or a checkpoint
    (Ray Train), so both frameworks have something to roll back to.
    """
    return steps_per_epoch + max(1, (3 * steps_per_epoch) // 4)


# Recovery variants train a warm-up epoch, then the epoch with the kill.
RECOVERY_EPOCHS = 2

# ... on the full-size workload, in quick mode too: Ray Train registers a reported
# checkpoint only when its controller next polls the workers (every 2 s by
# default), so the kill must come seconds after the epoch-1 checkpoint, and the
# quick workload's epochs last a fraction of a second.
RECOVERY_MODE = "full"


def unwarmed_note(run) -> str:
    """What a kill run's one-line summary adds when its spare had not finished warming up."""
    return " (the spare was NOT warm yet)" if run.get("spare_warm_at_kill") is False else ""


def start_kill_run(description: str, extra):
    """The common start of a kill variant: ``(args, t0, workload, steps_per_epoch, kill step)``."""
    from bench.child import launch_time, parse_args, set_threads
    from bench.workloads import get_workload

    args = parse_args(description, extra)
    set_threads(args.threads)
    t0 = launch_time()
    workload = get_workload(args.workload, RECOVERY_MODE)  # whatever --mode says
    steps_per_epoch = workload.num_samples // workload.batch_size
    return args, t0, workload, steps_per_epoch, kill_step(steps_per_epoch)
