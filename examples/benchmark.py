"""The side-by-side benchmark as a legacy-style example script (a thin wrapper over bench/).

    python examples/benchmark.py --smoke-test             # seconds: raysgd 1 worker vs a plain loop
    python examples/benchmark.py                           # make bench: all variants, MLP
    python examples/benchmark.py --model resnet            # the CIFAR-shaped ResNet workload
    python examples/benchmark.py --use-gpu                 # make bench-gpu: ResNet-50, fp32/fp16

Every run is ``python -m bench`` underneath: each variant (raysgd, torchrun
DDP, Ray Train, a plain loop) runs as its own process, the table shows
median/min/max time to first step, steady samples/s, wall time and peak
memory, then the ratios; the figures are also written as JSON (``--out``).
Other options are passed on to bench (see ``python -m bench --help``).
"""
from __future__ import annotations

import argparse
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE_VARIANTS = ["raysgd_1w", "plain_1t"]


def bench_arguments(argv=None):
    """This script's flags, translated into ``python -m bench`` arguments."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-test", action="store_true",
                        help="quick mode, two variants (checks it runs; no speed claims)")
    parser.add_argument("--use-gpu", action="store_true", help="the GPU precision benchmark")
    parser.add_argument("--model", choices=("mlp", "resnet"), default="mlp")
    args, rest = parser.parse_known_args(argv)
    if args.use_gpu:
        return ["--gpu", *(["--quick"] if args.smoke_test else []), *rest]
    smoke = ["--quick", "--variants", *SMOKE_VARIANTS] if args.smoke_test else []
    return ["--workload", args.model, *smoke, *rest]


def main(argv=None) -> int:
    sys.path.insert(0, REPO_ROOT)  # bench/ lives in the repository, not in the package
    from bench.__main__ import main as bench_main

    return bench_main(bench_arguments(argv))


if __name__ == "__main__":
    sys.exit(main())
