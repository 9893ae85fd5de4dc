"""The resume benchmark's training script, run (and SIGKILLed, and run again) as a driver.

    python -m bench.disk.driver --dir RUN_DIR --step-dir STEP_DIR [--mode full]

The bench MLP on 2 workers with a disk checkpoint at every commit; rank 0 logs
each completed step (``bench/recovery/steplog.py``). On a second run with the
same ``--dir`` it resumes from the newest checkpoint.
"""
from __future__ import annotations

import argparse
import json

import ray
from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

from bench.disk.operators import PacedStepLogOperator
from bench.workloads import get_workload

def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True)
    parser.add_argument("--step-dir", required=True)
    parser.add_argument("--mode", default="full")
    parser.add_argument("--commit-every", type=int, default=16,
                        help="steps between commits; every commit is written to disk")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    workload = get_workload("mlp", args.mode)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    trainer = TorchTrainer(PacedStepLogOperator, num_workers=2, use_gpu=False,
                           config={BATCH_SIZE: workload.batch_size, "workload": "mlp",
                                   "mode": args.mode, "step_dir": args.step_dir,
                                   "step_sleep": args.step_sleep},
                           checkpoint_dir=args.dir, checkpoint_every_n_steps=args.commit_every,
                           checkpoint_every_n_steps_to_disk=args.commit_every)
    print(json.dumps({"resumed_epoch": trainer.epoch}), flush=True)
    while trainer.epoch < workload.epochs:
        trainer.train()
    trainer.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
