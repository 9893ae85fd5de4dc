"""Variant: raysgd ``TorchTrainer`` under ``--strategy ddp|fsdp`` with ``--workers N``.

Prints steady samples/s (epochs 2..N, timed in the driver), each rank's peak memory above
its pre-model baseline, the full state's bytes and the bytes each rank put in the last
commit's snapshot (its model and optimizer part).
"""
from __future__ import annotations

import argparse
import time

import ray

import raysgd
from raysgd import TorchTrainer
from raysgd.state.packing import PACKED
from raysgd.utils import BATCH_SIZE

from bench.child import emit
from bench.fsdp.model import SIZES, Block, tensor_bytes
from bench.fsdp.bench_operator import FSDPBenchOperator


def packed_bytes(obj) -> int:
    if isinstance(obj, PACKED):  # bytes in Ray's store or in the driver's slab
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(packed_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(packed_bytes(v) for v in obj)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--strategy", choices=("ddp", "fsdp"), required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mode", choices=tuple(SIZES), default="full")
    parser.add_argument("--gpu", action="store_true",
                        help="train on the GPU: NCCL, bf16 (one rank per GPU)")
    parser.add_argument("--one-call", action="store_true",
                        help="train the timed epochs in one train() call without in-epoch "
                             "commits: one commit instead of one per epoch and more (a "
                             "diagnosis: what commits cost)")
    args = parser.parse_args()
    size = SIZES[args.mode]
    strategy = raysgd.FSDP(units=Block) if args.strategy == "fsdp" else "ddp"
    device = ({"use_gpu": True, "backend": "nccl", "use_fp16": "bf16"} if args.gpu
              else {"use_gpu": False})
    ray.init(address="local", num_cpus=max(4, args.workers), include_dashboard=False)
    trainer = TorchTrainer(FSDPBenchOperator, num_workers=args.workers, **device,
                           strategy=strategy, spare_workers=0,
                           config={BATCH_SIZE: size.batch, "mode": args.mode},
                           **({"checkpoint_every_n_steps": None} if args.one_call else {}))
    trainer.train()  # warm-up epoch
    steps = trainer.apply_all_operators(lambda op: len(op.train_loader))[0]  # per epoch
    start = time.perf_counter()
    if args.one_call:
        trainer.train(num_steps=(size.epochs - 1) * steps)
    else:
        for _ in range(size.epochs - 1):
            trainer.train()
    steady = (size.epochs - 1) * size.samples / (time.perf_counter() - start)
    peaks = trainer.apply_all_operators(lambda op: op.peak_growth())
    state = trainer.state_dict()
    snapshots = ray.get(trainer._supervisor.commit.snapshots)  # the bench reads the commit
    parts = [{k: v for k, v in s["state"].items() if k in ("models", "optimizers", "shards")}
             for s in snapshots]
    emit({"strategy": args.strategy, "workers": args.workers, "one_call": args.one_call,
          "steps_per_epoch": steps,
          "steady_samples_per_s": steady, "peak_growth_mib": [p / 2**20 for p in peaks],
          "state_bytes": tensor_bytes([state["models"], state["optimizers"]]),
          "commit_bytes_per_rank": [packed_bytes(p) for p in parts],
          "param_bytes": size.param_bytes,
          "gpu_peak_mib": trainer.apply_all_operators(lambda op: op.gpu_peak_mib())})
    trainer.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
