"""``python -m bench.fsdp [--quick] [--repeats N] [--out PATH]``: run, print ratios, save."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

from bench import T0_ENV
from bench.launch import REPO_ROOT, child_env, parse_result
from bench.recovery import unwarmed_note

DEFAULT_OUT = os.path.join(REPO_ROOT, "bench", "results", "fsdp.json")
TARGETS = {"fsdp/torchrun": ">= 0.95", "peak FSDP/DDP at 2 workers": "<= 0.6",
           "commit bytes per rank / (state/N)": "~1",
           "kill→next step, FSDP with a warm spare": "<= 1 s",
           "steps re-run / commit interval": "<= 1"}


def _run(command: List[str], timeout_s: float) -> Dict[str, Any]:
    env = child_env(1)
    env[T0_ENV] = str(time.time())
    started = time.perf_counter()
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                             cwd=REPO_ROOT, env=env)
        result = parse_result(out.stdout) or {"error": (out.stdout + out.stderr)[-1500:]}
    except subprocess.TimeoutExpired:
        result = {"error": f"timed out after {timeout_s:.0f}s"}
    result["wall_s"] = time.perf_counter() - started
    print(f"  {' '.join(command[2:])}: {_short(result)}", file=sys.stderr, flush=True)
    return result


def _short(result: Dict[str, Any]) -> str:
    if "steady_samples_per_s" in result:
        gpu = [p for p in result.get("gpu_peak_mib") or [] if p is not None]
        return f"{result['steady_samples_per_s']:.0f} samples/s" + (
            f", peak GPU memory {max(gpu):.0f} MiB" if gpu else "")
    if "recovery_s" in result:
        return f"kill→next step {result['recovery_s']:.2f} s{unwarmed_note(result)}"
    return str(result.get("error", "?"))[:120]


def gpu_commands() -> Dict[str, List[str]]:
    """``--gpu``: one rank on the machine's GPU (NCCL, bf16), raysgd against torchrun."""
    py = sys.executable
    raysgd = [py, "-m", "bench.fsdp.raysgd_run", "--strategy", "fsdp", "--workers", "1",
              "--mode", "gpu", "--gpu"]
    # one_call: the timed epochs in one train() call, so one commit (a diagnosis of theirs).
    return {"raysgd_fsdp_gpu": raysgd, "raysgd_fsdp_gpu_one_call": raysgd + ["--one-call"],
            "torchrun_fsdp_gpu": [py, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node=1", "-m", "bench.fsdp.torchrun_fsdp",
                                  "--mode", "gpu", "--gpu"]}


def gpu_once() -> Dict[str, List[str]]:
    """``--gpu``: the rank SIGKILLed, with a warm spare (which holds no GPU until it takes the
    rank's) and without one."""
    py = sys.executable
    kill = [py, "-m", "bench.recovery.raysgd_kill", "--gpu", "--num-workers", "1",
            "--victim-rank", "0"]
    return {"kill_fsdp_gpu_spare1_warm": kill + ["--strategy", "fsdp", "--spare-workers", "1",
                                                 "--warm-spare"],
            "kill_ddp_gpu_spare1_warm": kill + ["--spare-workers", "1", "--warm-spare"],
            "kill_ddp_gpu_spare0": kill + ["--spare-workers", "0"]}


def commands(mode: str) -> Dict[str, List[str]]:
    py = sys.executable
    torchrun = [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                "-m", "bench.fsdp.torchrun_fsdp", "--mode", mode]
    raysgd_fsdp = [py, "-m", "bench.fsdp.raysgd_run", "--strategy", "fsdp", "--mode", mode]
    # one_call: the timed epochs in one train() call, so one commit (a diagnosis of theirs).
    return {"raysgd_fsdp_2w": raysgd_fsdp, "raysgd_fsdp_2w_one_call": raysgd_fsdp + ["--one-call"],
            "torchrun_fsdp_2w": torchrun,
            "raysgd_ddp_2w": [py, "-m", "bench.fsdp.raysgd_run", "--strategy", "ddp",
                              "--mode", mode]}


def once(mode: str, quick: bool) -> Dict[str, List[str]]:
    py = sys.executable
    memory = mode if quick else "memory"  # peak memory on a model large enough to show it
    runs = {f"raysgd_{s}_mem_{n}w": [py, "-m", "bench.fsdp.raysgd_run", "--strategy", s,
                                      "--workers", str(n), "--mode", memory]
            for n in (2, 4) for s in ("fsdp", "ddp")}
    kill_mode = ["--mode", "quick"] if quick else []
    # spare1_warm: the kill once the spare finished warming; spare1: while it still warms
    # (on two busy cores); spare0: no spare, new processes.
    for strategy in ("fsdp", "ddp"):
        for spares, extra in (("1_warm", ("--warm-spare",)), ("1", ()), ("0", ())):
            runs[f"kill_{strategy}_spare{spares}"] = [
                py, "-m", "bench.recovery.raysgd_kill", "--strategy", strategy,
                "--spare-workers", spares[0], *extra, *kill_mode]
    runs["raytrain_fsdp_2w"] = [py, "-m", "bench.fsdp.raytrain_fsdp", "--mode", mode]
    return runs


def _median(runs: List[Dict[str, Any]], key: str) -> Optional[float]:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def ratios(results: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
    def speed(name):
        return _median(results.get(name, []), "steady_samples_per_s")

    def peak(name):
        runs = [r for r in results.get(name, []) if "peak_growth_mib" in r]
        return max(runs[0]["peak_growth_mib"]) if runs else None

    def div(a, b):
        return a / b if a is not None and b else None

    out = {"fsdp/torchrun": div(speed("raysgd_fsdp_2w"), speed("torchrun_fsdp_2w")),
           "fsdp/torchrun (GPU, NCCL, bf16, 1 rank)":
               div(speed("raysgd_fsdp_gpu"), speed("torchrun_fsdp_gpu")),
           "fsdp in one call/torchrun (GPU, diagnosis: commits)":
               div(speed("raysgd_fsdp_gpu_one_call"), speed("torchrun_fsdp_gpu")),
           "fsdp in one call/fsdp (diagnosis: commits)":
               div(speed("raysgd_fsdp_2w_one_call"), speed("raysgd_fsdp_2w")),
           "fsdp/ddp (raysgd)": div(speed("raysgd_fsdp_2w"), speed("raysgd_ddp_2w")),
           "peak FSDP/DDP at 2 workers": div(peak("raysgd_fsdp_mem_2w"), peak("raysgd_ddp_mem_2w")),
           "peak FSDP/DDP at 4 workers": div(peak("raysgd_fsdp_mem_4w"), peak("raysgd_ddp_mem_4w")),
           "peak raysgd FSDP/torchrun FSDP (small model)":
               div(peak("raysgd_fsdp_2w"), peak("torchrun_fsdp_2w"))}
    for name, n in (("raysgd_fsdp_mem_2w", 2), ("raysgd_fsdp_mem_4w", 4), ("raysgd_ddp_mem_2w", 2)):
        runs = [r for r in results.get(name, []) if "commit_bytes_per_rank" in r]
        if runs:
            out[f"commit bytes per rank / (state/N), {name}"] = \
                max(runs[0]["commit_bytes_per_rank"]) / (runs[0]["state_bytes"] / n)
    for name, runs in results.items():
        if name.startswith("kill_") and runs and "recovery_s" in runs[0]:
            out[f"kill→next step (s), {name}"] = runs[0]["recovery_s"]
            out[f"steps re-run / commit interval, {name}"] = \
                runs[0]["steps_rerun"] / runs[0]["commit_interval"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fsdp", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repetition")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", default=None,
                        help="run only these variants (names as printed)")
    parser.add_argument("--gpu", action="store_true",
                        help="on a GPU machine: one rank on the GPU (NCCL, bf16) against "
                             "torchrun, and a GPU rank killed with and without a warm spare")
    args = parser.parse_args(argv)
    mode = "gpu" if args.gpu else "quick" if args.quick else "full"
    repeats = args.repeats or (1 if args.quick else 3)
    results: Dict[str, List[Dict[str, Any]]] = {}
    keep = (lambda name: name in args.only) if args.only else (lambda name: True)
    rotating = [(n, c) for n, c in (gpu_commands() if args.gpu else commands(mode)).items()
                if keep(n)]
    for rep in range(repeats):  # the order rotates, so drift hits every variant alike
        shift = rep % max(1, len(rotating))
        for name, command in rotating[shift:] + rotating[:shift]:
            results.setdefault(name, []).append(_run(command, args.timeout))
    for name, command in (gpu_once() if args.gpu else once(mode, args.quick)).items():
        if not keep(name):
            continue
        results.setdefault(name, []).append(_run(command, args.timeout))
    table = ratios(results)
    print(f"\nFSDP benchmark ({mode}), {repeats} repetition(s) of the throughput variants\n")
    for name, runs in results.items():
        peaks = [max(r["peak_growth_mib"]) for r in runs if "peak_growth_mib" in r]
        print(f"  {name:22s} " + "; ".join(_short(r) for r in runs)
              + (f"; peak growth {', '.join(f'{p:.0f}' for p in peaks)} MiB" if peaks else ""))
    print("\nratios (targets: " + ", ".join(f"{k} {v}" for k, v in TARGETS.items()) + ")")
    for key, value in table.items():
        if value is not None or not args.gpu:
            print(f"  {key:58s} {'n/a' if value is None else f'{value:.3f}'}")
    raytrain = results.get("raytrain_fsdp_2w", [{}])[0]
    if "error" in raytrain:
        print(f"\nRay Train FSDP on CPU: does not run ({raytrain['error'][:160]})")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"mode": mode, "repeats": repeats, "results": results, "ratios": table},
                  handle, indent=1)
    failed = [n for n, runs in results.items() if n != "raytrain_fsdp_2w"
              and any("error" in r for r in runs)]
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
