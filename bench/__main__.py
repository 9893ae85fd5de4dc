"""``python -m bench [--quick] [--workload mlp|resnet] [--out PATH]``: run, print, save.

``python -m bench --recovery [...]`` runs the recovery benchmark instead
(``python -m bench.recovery``; its own options follow ``--recovery``), and
``python -m bench --gpu [...]`` the GPU precision benchmark (``python -m bench.gpu``),
and ``python -m bench --warm [...]`` the warm-worker benchmark (``python -m bench.warm``),
and ``python -m bench --data [...]`` the Ray Data input benchmark (``python -m bench.data``).
"""
from __future__ import annotations

import argparse
import os
import sys

from bench import catalog
from bench.launch import REPO_ROOT, common_parser, run_all
from bench.report import compute_ratios, epoch_table, metadata_block, save, summarize, tables
from bench.workloads import NAMES

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "latest.json")


def parse_args(argv=None) -> argparse.Namespace:
    parser = common_parser("python -m bench", __doc__, DEFAULT_OUT, catalog.BY_NAME)
    parser.add_argument("--workload", choices=NAMES, default="mlp")
    parser.add_argument("--recovery", action="store_true",
                        help="run the recovery benchmark instead (python -m bench.recovery)")
    parser.add_argument("--gpu", action="store_true",
                        help="run the GPU precision benchmark instead (python -m bench.gpu)")
    parser.add_argument("--warm", action="store_true",
                        help="run the warm-worker benchmark instead (python -m bench.warm)")
    parser.add_argument("--data", action="store_true",
                        help="run the Ray Data input benchmark instead (python -m bench.data)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--recovery" in argv:
        from bench.recovery.cli import main as recovery_main

        return recovery_main([arg for arg in argv if arg != "--recovery"])
    if "--gpu" in argv:
        from bench.gpu.cli import main as gpu_main

        return gpu_main([arg for arg in argv if arg != "--gpu"])
    if "--warm" in argv:
        from bench.warm.cli import main as warm_main

        return warm_main([arg for arg in argv if arg != "--warm"])
    if "--data" in argv:
        from bench.data.cli import main as data_main

        return data_main([arg for arg in argv if arg != "--data"])
    args = parse_args(argv)
    mode = "quick" if args.quick else "full"
    repeats = args.repeats or (1 if args.quick else 3)
    variants = catalog.select(args.variants)
    runs = run_all(variants, args.workload, mode, repeats, args.timeout)
    summaries = {name: summarize(variant_runs) for name, variant_runs in runs.items()}
    ratios = compute_ratios(summaries)
    meta = metadata_block({"workload": args.workload, "mode": mode, "repeats": repeats})
    print(f"\nworkload {args.workload} ({mode}), {repeats} repetition(s); "
          f"memory = {meta['memory_method']}\n")
    print(tables(summaries, ratios))
    print(epoch_table(runs, first=2) + "\n")
    variants_doc = {v.name: {"label": v.label, "command": v.command(args.workload, mode),
                             "summary": summaries[v.name], "runs": runs[v.name]}
                    for v in variants}
    return save(args.out, meta, variants_doc, ratios, runs)


if __name__ == "__main__":
    sys.exit(main())
