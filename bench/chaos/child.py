"""One chaos run: ``python -m bench.chaos.child --trainer NAME --schedule ... --window S``.

Starts the trainer in a fresh process tree (a Ray cluster of its own, or torchrun), applies
the schedule for the window, prints the figures (``BENCH_RESULT``) and kills everything it
started. Only what happened inside the window counts.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

from bench.chaos.analysis import run_figures
from bench.chaos.inject import Injector
from bench.chaos.runners import RUNNERS
from bench.chaos.schedule import from_args
from bench.child import emit, parse_args
from bench.procmem import descendants
from bench.recovery.steplog import read_log
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--trainer", choices=sorted(RUNNERS), required=True)
    parser.add_argument("--window", type=float, required=True, help="seconds of training")
    parser.add_argument("--schedule", default="", help="bench.chaos.schedule.to_args text")
    parser.add_argument("--notice", type=float, required=True, help="a preemption's notice (s)")
    parser.add_argument("--every", type=int, required=True,
                        help="the peers' checkpoint interval in steps")
    parser.add_argument("--keep", action="store_true",
                        help="keep the run's directory (step log, rank files, checkpoints)")


def _kill_descendants() -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    args = parse_args(__doc__, _extra)
    workload = get_workload(args.workload, args.mode)
    work = tempfile.mkdtemp(prefix=f"bench-chaos-{args.trainer}-")
    step_dir, storage = os.path.join(work, "steps"), os.path.join(work, "storage")
    os.makedirs(step_dir)
    os.makedirs(storage)
    runner = RUNNERS[args.trainer](args, step_dir, storage)
    t0 = runner.start()
    injector = Injector(from_args(args.schedule), runner.targets, t0, step_dir, args.notice)
    injector.run_until(t0 + args.window)
    # Samples per logged step: the global batch, but torchft logs per-group batches.
    batch = getattr(runner, "step_samples", workload.batch_size)
    figures = run_figures(read_log(step_dir), injector.applied, t0, args.window, batch)
    emit({**figures, "trainer": args.trainer, "window_s": args.window,
          "global_batch": batch, "applied": injector.applied,
          "trainer_error": runner.error, "reported": runner.reported,
          "trainer_log": list(runner.trainer_log), "wall_s_child": time.time() - t0})
    sys.stdout.flush()
    _clean_up(runner, work, args.keep)
    os._exit(0)


def _clean_up(runner, work: str, keep: bool) -> None:
    """Once the figures are out: end the trainer's processes and drop the run's files. A
    failure here is reported, not the run's: its figures stand."""
    started = time.time()
    try:
        _kill_descendants()
        runner.targets.forget()
        if keep:
            print(f"kept {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
    except Exception:  # noqa: BLE001 - printed for whoever reads the run's output
        traceback.print_exc()
    print(f"bench.chaos.child: cleaned up in {time.time() - started:.2f}s", file=sys.stderr,
          flush=True)


if __name__ == "__main__":
    main()
