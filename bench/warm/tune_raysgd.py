"""Variant: raysgd under Ray Tune, trials one after the other; the time of ``fit()``.

``TorchTrainer.as_trainable(LearningRateOperator, num_workers=2)`` (the bench
operator with the trial's ``lr``) with Tune's ``reuse_actors=True``: when the
trainable implements ``reset_config``, Tune keeps the trainable actor (and so
its trainer's warm workers) from one trial to the next. Every trial trains one
epoch (one Tune iteration); its ``override_tune_step`` also reports the
workers' pids and the trainable's, so the run can count the processes it
started. No trial writes a checkpoint (``checkpoint_at_end=False``): the Ray
Train variant reports none either. A raysgd without ``reset_config`` gets
``reuse_actors=False`` (Tune would fail every reused trial otherwise), and the
run says so (``reuse_actors`` in its figures).
"""
import os

from ray import tune

from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.child import emit, parse_args, set_threads
from bench.warm import TUNE_TRIALS, TUNE_WORKLOAD_MODE
from bench.warm.tune_operator import LearningRateOperator
from bench.warm.tune_results import learning_rates, timed_fit
from bench.workloads import get_workload


def _extra(parser) -> None:
    parser.add_argument("--num-workers", type=int, default=2)


def tune_step(trainer, info) -> dict:
    """One epoch, plus the pids of the processes that trained it."""
    metrics = trainer.train()
    pids = trainer.apply_all_workers(os.getpid)
    return {"train_loss": metrics.get("train_loss"),
            "bench_worker_pids": ",".join(str(pid) for pid in pids),
            "bench_trainable_pid": os.getpid()}


def supports_reuse(trainable: type) -> bool:
    """Whether Tune can hand this trainable a new trial (it overrides ``reset_config``)."""
    return trainable.reset_config is not tune.Trainable.reset_config


def main() -> None:
    args = parse_args(__doc__, _extra)
    set_threads(args.threads)
    trials = TUNE_TRIALS[args.mode]
    workload = get_workload(args.workload, TUNE_WORKLOAD_MODE)
    trainable = TorchTrainer.as_trainable(
        LearningRateOperator, num_workers=args.num_workers, use_gpu=False,
        num_cpus_per_worker=args.threads, override_tune_step=tune_step,
        config={BATCH_SIZE: workload.batch_size, "workload": args.workload,
                "mode": TUNE_WORKLOAD_MODE})
    reuse = supports_reuse(trainable)

    def make_tuner(storage: str):
        return tune.Tuner(
            trainable, param_space={"lr": tune.grid_search(learning_rates(trials))},
            tune_config=tune.TuneConfig(max_concurrent_trials=1, reuse_actors=reuse),
            run_config=tune.RunConfig(name="bench-warm", storage_path=storage, verbose=0,
                                      stop={"training_iteration": 1},
                                      checkpoint_config=tune.CheckpointConfig(
                                          checkpoint_at_end=False)))

    figures = timed_fit(make_tuner, "bench-warm-tune-raysgd-", trials)
    emit({**figures, "reuse_actors": reuse})


if __name__ == "__main__":
    main()
