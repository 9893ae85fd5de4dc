"""Ray Tune on a real Ray: grid search, ASHA, PBT, recovery inside a trial. Marked slow."""
import os
import signal
import threading
import time

import pytest
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

from operators_for_tests import LinearOperator, OriginOperator, SlowOperator
from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def fit(trainable, tmp_path, param_space, stop_iterations, **tune_config):
    tuner = tune.Tuner(
        trainable, param_space=param_space,
        tune_config=tune.TuneConfig(max_concurrent_trials=1, **tune_config),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="raysgd",
                                  stop={"training_iteration": stop_iterations}, verbose=0))
    return tuner.fit()


def test_grid_search_reports_reduced_metrics_and_the_better_lr_wins(ray_cpus, tmp_path):
    shared = {BATCH_SIZE: 64}
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=2,
                                          use_gpu=False, config=shared)
    results = fit(trainable, tmp_path, {"lr": tune.grid_search([1e-4, 1e-2])}, 2,
                  metric="val_loss", mode="min")
    assert shared == {BATCH_SIZE: 64}  # each trial merged into its own copy
    assert len(results) == 2 and not results.errors
    for result in results:
        metrics = result.metrics
        assert metrics["training_iteration"] == 2 and metrics["epoch"] == 2
        assert metrics["num_samples"] == 1000 and metrics["val_num_samples"] == 400  # both workers
    assert results.get_best_result().config["lr"] == 1e-2


def test_the_legacy_tune_run_snippet_still_runs(ray_cpus, tmp_path):
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=1,
                                          use_gpu=False, config={BATCH_SIZE: 128})
    analysis = tune.run(trainable, num_samples=1, config={"lr": tune.grid_search([1e-4, 1e-2])},
                        stop={"training_iteration": 2}, storage_path=str(tmp_path), verbose=0)
    assert analysis.get_best_config(metric="val_loss", mode="min") == {"lr": 1e-2}


def test_asha_stops_a_clearly_bad_trial_early(ray_cpus, tmp_path):
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=1,
                                          use_gpu=False, config={BATCH_SIZE: 64})
    scheduler = ASHAScheduler(max_t=4, grace_period=1, reduction_factor=2)
    results = fit(trainable, tmp_path, {"lr": tune.grid_search([1e-2, 1e-9])}, 4,
                  metric="val_loss", mode="min", scheduler=scheduler)
    iterations = {r.config["lr"]: r.metrics["training_iteration"] for r in results}
    assert iterations[1e-2] == 4 and iterations[1e-9] < 4


def lr_in_use(trainer):
    return trainer.apply_all_operators(lambda op: op.optimizer.param_groups[0]["lr"])[0]


def report_origin(trainer, info):
    metrics = trainer.train()
    metrics["origin"] = trainer.apply_all_operators(lambda op: op.origin)[0]
    metrics["lr_in_use"] = lr_in_use(trainer)
    return metrics


def test_pbt_exploit_copies_the_donors_state_and_keeps_the_new_hyperparameters(ray_cpus, tmp_path):
    trainable = TorchTrainer.as_trainable(training_operator_cls=OriginOperator, num_workers=1,
                                          use_gpu=False, config={BATCH_SIZE: 64},
                                          override_tune_step=report_origin)
    pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=2,
                                  hyperparam_mutations={"lr": [3e-3, 5e-3, 2e-2]},
                                  quantile_fraction=0.5, resample_probability=1.0,
                                  synch=True)  # exploit once both trials reached the interval
    tuner = tune.Tuner(
        trainable, param_space={"lr": tune.grid_search([1e-2, 1e-9])},
        tune_config=tune.TuneConfig(metric="train_loss", mode="min", scheduler=pbt),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="pbt",
                                  # one exploit (at iteration 2), then two iterations with
                                  # the donor's state (the last one is never perturbed)
                                  stop={"training_iteration": 4}, verbose=0))
    results = tuner.fit()
    assert not results.errors
    histories = {id(r): r.metrics_dataframe for r in results}
    first_origins = {h["origin"].iloc[0] for h in histories.values()}
    exploited = [r for r in results if histories[id(r)]["origin"].nunique() > 1]
    assert exploited, "PBT never exploited"
    for result in exploited:
        history = histories[id(result)]
        later = history["origin"].iloc[-1]
        assert later in first_origins and later != history["origin"].iloc[0]  # the donor's state
        # The recipient trains with its own, mutated lr, not the donor's optimizer lr (1e-2).
        assert result.config["lr"] in (3e-3, 5e-3, 2e-2)
        assert history["lr_in_use"].iloc[-1] == result.config["lr"]


def test_a_worker_killed_inside_a_trial_is_recovered_there(ray_cpus, tmp_path):
    def kill_mid_epoch(trainer, info):
        pids = trainer.apply_all_workers(os.getpid)
        if info["iteration"] == 1:
            threading.Thread(target=lambda: (time.sleep(1.0), os.kill(pids[1], signal.SIGKILL)),
                             daemon=True).start()
        metrics = trainer.train()
        metrics["recoveries"] = trainer.recovery_stats.recoveries
        # The trial's group reserves the driver's and both workers' CPUs (3 of 4); the
        # workers, zero-resource actors beside its bundles, reserve nothing more.
        metrics["cpus_free_in_trial"] = ray.available_resources().get("CPU", 0)
        group = ray.util.get_current_placement_group()
        bundle_nodes = ray.util.placement_group_table(group)["bundles_to_node_id"]
        worker_nodes = trainer.apply_all_workers(lambda: ray.get_runtime_context().get_node_id())
        metrics["workers_on_trial_nodes"] = worker_nodes == [bundle_nodes[1], bundle_nodes[2]]
        return metrics

    trainable = TorchTrainer.as_trainable(training_operator_cls=SlowOperator, num_workers=2,
                                          use_gpu=False, checkpoint_every_n_steps=5,
                                          config={BATCH_SIZE: 64, "sleep_s": 0.1},
                                          override_tune_step=kill_mid_epoch)
    results = fit(trainable, tmp_path, {}, 2)
    assert not results.errors
    metrics = results[0].metrics
    assert metrics["recoveries"] == 1 and metrics["training_iteration"] == 2
    assert metrics["workers_on_trial_nodes"]  # the restarted workers too
    assert metrics["cpus_free_in_trial"] == 1
    assert metrics["num_samples"] == 1000


def live_actors() -> set:
    """Actors alive or still starting (a spare may be)."""
    return {actor_id for actor_id, actor in ray._private.state.actors().items()
            if actor["State"] != "DEAD"}


def count_new_actors(before: set):
    """A step reporting the live actors that were not there before the trial (the trial
    actor itself, its workers and any spare), counted as Ray 1.12's Tune tests count them."""
    def step(trainer, info):
        metrics = trainer.train()
        metrics["new_actors"] = len(live_actors() - before)
        metrics["spares"] = len(trainer._supervisor.group.spares)
        return metrics
    return step


def test_a_trial_keeps_no_spare_by_default(ray_cpus, tmp_path):
    # (An explicit spare_workers in a trial is kept: tests/test_pool.py, WarmSettings.)
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=2,
                                          use_gpu=False, config={BATCH_SIZE: 64},
                                          override_tune_step=count_new_actors(live_actors()))
    results = fit(trainable, tmp_path, {}, 2)  # a spare would start at the first call's commit
    assert not results.errors
    metrics = results[0].metrics
    assert metrics["new_actors"] == 1 + 2  # the trial and its workers, as 1.12's tests count
    assert metrics["spares"] == 0


def report_processes(trainer, info):
    metrics = trainer.train()
    metrics["trainable_pid"] = os.getpid()  # not "pid": Tune fills that one in itself
    metrics["worker_pids"] = ",".join(map(str, trainer.apply_all_workers(os.getpid)))
    metrics["lr_in_use"] = lr_in_use(trainer)
    return metrics


def test_reuse_actors_runs_each_trial_on_the_same_trainable_and_workers(ray_cpus, tmp_path):
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator, num_workers=2,
                                          use_gpu=False, config={BATCH_SIZE: 64},
                                          override_tune_step=report_processes)
    lrs = [1e-4, 1e-3, 1e-2]
    results = fit(trainable, tmp_path, {"lr": tune.grid_search(lrs)}, 1, reuse_actors=True)
    assert len(results) == 3 and not results.errors
    metrics = [r.metrics for r in results]
    assert sorted(r.config["lr"] for r in results) == lrs
    for result in results:  # each trial trained with its own lr, from iteration 1
        assert result.metrics["lr_in_use"] == result.config["lr"]
        assert result.metrics["training_iteration"] == 1 and result.metrics["epoch"] == 1
        assert result.metrics["num_samples"] == 1000
    assert len({m["trainable_pid"] for m in metrics}) == 1, metrics  # Tune reused the actor
    # raysgd's warm worker pool: the rebuilt trainer took the same worker processes.
    assert len({m["worker_pids"] for m in metrics}) == 1, metrics
