"""Variant: Ray Train 2.x with ``prepare_model(parallel_strategy="fsdp")`` on CPU workers.

Ray Train's FSDP path refuses CPU-only training; the variant reports that error (or, where it
runs, steady samples/s of the same loop) so the table says so instead of leaving a gap.
"""
from __future__ import annotations

import argparse
import time

import ray
import torch
from torch import nn
from torch.utils.data import DataLoader

from bench.child import emit
from bench.fsdp.model import SIZES


def loop(config):
    import ray.train
    from ray.train.torch import prepare_data_loader, prepare_model

    size = SIZES[config["mode"]]
    model = prepare_model(size.model(), parallel_strategy="fsdp")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loader = prepare_data_loader(DataLoader(size.data(), batch_size=size.batch // 2))
    start = None
    for epoch in range(size.epochs):
        if epoch == 1:
            start = time.perf_counter()
        for x, y in loader:
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    ray.train.report({"steady": (size.epochs - 1) * size.samples / (time.perf_counter() - start)})


def main() -> None:
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=tuple(SIZES), default="full")
    args = parser.parse_args()
    ray.init(address="local", num_cpus=4, include_dashboard=False)
    try:
        result = TorchTrainer(loop, train_loop_config={"mode": args.mode},
                              scaling_config=ScalingConfig(num_workers=2, use_gpu=False)).fit()
        emit({"strategy": "raytrain-fsdp", "workers": 2,
              "steady_samples_per_s": result.metrics["steady"]})
    except Exception as exc:  # the figure is the refusal itself
        text = str(exc)
        why = next((line.strip() for line in text.splitlines() if "FSDP" in line), text[-300:])
        emit({"strategy": "raytrain-fsdp", "workers": 2, "error": why})
    ray.shutdown()


if __name__ == "__main__":
    main()
