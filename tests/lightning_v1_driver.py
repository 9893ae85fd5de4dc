"""Trains lightning_v1_modules.V1Regressor twice on a real pytorch_lightning 1.x: with
Lightning's own Trainer (one process), then with raysgd (2 workers on a Ray it starts itself),
and prints what each saw as one JSON line for tests/test_lightning_v1.py to compare.

Run by that test with the 1.x install first on PYTHONPATH, which the Ray workers get too."""
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")  # 1.x's deprecation notices; the test reads stdout only


def lightning_run():
    import pytorch_lightning as pl
    from lightning_v1_modules import V1Regressor

    module = V1Regressor({})
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, accelerator="cpu", devices=1)
    trainer.fit(module)
    return {"version": pl.__version__, **module.report(),
            "callback_metrics": sorted(trainer.callback_metrics),
            "lr": trainer.optimizers[0].param_groups[0]["lr"]}


def raysgd_run():
    import ray

    from lightning_v1_modules import V1Regressor
    from raysgd import TorchTrainer, TrainingOperator

    address = os.environ.get("RAYSGD_TEST_RAY_ADDRESS")
    if address:  # the test session's Ray: this job's workers get this PYTHONPATH (1.x first)
        ray.init(address=address, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}})
    else:  # a Ray of its own, whose workers inherit this environment
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(training_operator_cls=TrainingOperator.from_ptl(V1Regressor),
                           num_workers=2, use_gpu=False, config={}, spare_workers=0)
    try:
        results = [trainer.train(), trainer.validate(), trainer.train(), trainer.validate()]
        reports = trainer.apply_all_operators(lambda op: op.get_model().report())
        lrs = trainer.apply_all_operators(lambda op: op.optimizers[0].param_groups[0]["lr"])
        return {"results": results, "reports": reports, "lrs": lrs}
    finally:
        trainer.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps({"lightning": lightning_run(), "raysgd": raysgd_run()}))
