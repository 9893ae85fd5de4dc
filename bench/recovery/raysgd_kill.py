"""Variant: raysgd ``TorchTrainer`` (2 workers), one worker SIGKILLed mid-epoch.

Epoch 1 is warm-up (its ``train()`` ends with a commit). Before epoch 2 the
worker pids come from ``trainer.apply_all_workers(os.getpid)``; a thread kills
rank 1 when rank 0's step log shows the kill step. ``train()`` recovers by itself.
``--spare-workers N`` passes ``spare_workers=N`` (without it, raysgd's default:
one warm spare takes the dead rank's place). ``--warm-spare`` waits after the warm-up epoch
until the spare has finished warming up; without it the kill may come while the spare still
warms (its rank's start then waits for the rest of the warm-up).
"""
import os
import shutil
import tempfile
import time
from typing import Tuple

import ray

import raysgd
from raysgd import TorchTrainer
from raysgd.commits.interval import AUTO
from raysgd.utils import BATCH_SIZE

from bench.child import emit
from bench.recovery import RECOVERY_EPOCHS, RECOVERY_MODE, start_kill_run
from bench.recovery.step_operator import StepLogOperator
from bench.recovery.steplog import Killer, analyse, read_log, read_setups


def _interval(value: str):
    return AUTO if value == AUTO else int(value)


def _at_kill(intervals, step, steps_per_epoch):
    """The interval of the call the kill came in (the first call is the warm-up epoch)."""
    if step is None or not intervals:
        return None
    return intervals[min(len(intervals) - 1, max(0, step // steps_per_epoch - 1))]


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--commit-every", type=_interval, default=AUTO,
                        help="checkpoint_every_n_steps: 'auto' (raysgd's default) or a number")
    parser.add_argument("--victim-rank", type=int, default=1)
    parser.add_argument("--spare-workers", type=int, default=None,
                        help="spare_workers (default: not passed, raysgd's default)")
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), default="ddp",
                        help="strategy: 'fsdp' shards the model (one unit; bench.fsdp uses it)")
    parser.add_argument("--warm-spare", action="store_true",
                        help="kill only once every spare has finished warming up")
    parser.add_argument("--gpu", action="store_true",
                        help="the ranks share the machine's one GPU (1/N each); NCCL for one "
                             "rank, gloo for more (NCCL refuses two ranks on one device)")


def gpu_settings(args) -> dict:
    """The trainer's device arguments: CPU, or the ranks sharing one GPU."""
    if not args.gpu:
        return {"use_gpu": False}
    return {"use_gpu": True, "num_gpus_per_worker": 1 / args.num_workers,
            "backend": "nccl" if args.num_workers == 1 else "gloo"}


# A spare warms up in a few seconds alone; beside busy processes (the smoke tests run two
# benchmarks at once) it may take much longer.
WARM_SPARE_TIMEOUT_S = 90.0


def wait_for_warm_spares(trainer, timeout_s: float = WARM_SPARE_TIMEOUT_S
                         ) -> Tuple[float, bool]:
    """(seconds waited, whether every spare of ``trainer`` is warm by then). No public API
    says whether a spare is warm, so the benchmark reads the worker group's spares
    (``raysgd.driver.warm.Spare``)."""
    started = time.monotonic()
    spares = trainer._supervisor.group.spares
    if not spares:
        return 0.0, True
    done, _ = ray.wait([spare.ready for spare in spares], num_returns=len(spares),
                       timeout=timeout_s)
    return time.monotonic() - started, len(done) == len(spares)


def main() -> None:
    args, t0, workload, steps_per_epoch, target = start_kill_run(__doc__, _extra)
    final_step = RECOVERY_EPOCHS * steps_per_epoch  # the kill must come before it
    step_dir = tempfile.mkdtemp(prefix="bench-recovery-raysgd-")
    spares = {} if args.spare_workers is None else {"spare_workers": args.spare_workers}
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        trainer = TorchTrainer(training_operator_cls=StepLogOperator, num_workers=args.num_workers,
                               num_cpus_per_worker=args.threads, **gpu_settings(args),
                               checkpoint_every_n_steps=args.commit_every,
                               strategy=raysgd.FSDP() if args.strategy == "fsdp" else "ddp",
                               config={BATCH_SIZE: workload.batch_size, "workload": args.workload,
                                       "mode": RECOVERY_MODE, "step_dir": step_dir}, **spares)
        trainer.train()  # warm-up epoch; the call ends with a commit
        waited, warm = wait_for_warm_spares(trainer) if args.warm_spare else (None, None)
        pids = trainer.apply_all_workers(os.getpid)
        killer = Killer(step_dir, target, lambda: pids[args.victim_rank],
                        final_step=final_step)
        killer.start()
        intervals = []  # each call's commit interval ("auto" chooses one per call)
        for _ in range(RECOVERY_EPOCHS - 1):
            intervals.append(trainer.recovery_stats.commit_interval)
            trainer.train()
        killer.join(timeout=1)
        stats = trainer.recovery_stats
        trainer.shutdown()
    finally:
        ray.shutdown()
    records, setups = read_log(step_dir), read_setups(step_dir)
    shutil.rmtree(step_dir, ignore_errors=True)
    figures = {"kill_step": target, "killed_at_step": killer.step_at_kill,
               "kill_error": killer.error or (None if killer.kill_time else "training ended first"),
               "commit_interval": _at_kill(intervals, killer.step_at_kill, steps_per_epoch),
               "commit_every": args.commit_every,
               "spare_workers": args.spare_workers, "strategy": args.strategy, "gpu": args.gpu,
               "warm_spare_wait_s": waited, "spare_warm_at_kill": warm,
               "first_step_s": records[0][1] - t0 if records else None,
               "final_step": records[-1][0] if records else None,
               "expected_final_step": final_step,
               "restarts": len({pid for _, _, pid in records}) - 1,
               "failures": stats.failures, "recoveries": stats.recoveries,
               "num_workers_after": stats.num_workers,
               "recovery_reported_s": stats.last_recovery_s,
               "steps_lost_reported": stats.steps_lost}
    if killer.kill_time is not None:
        figures.update(analyse(records, killer.kill_time, setups))
    emit(figures)


if __name__ == "__main__":
    main()
