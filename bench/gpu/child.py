"""What both GPU-mode variant processes share: arguments, device set-up, clock, result."""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable, Dict, Optional

import torch

from bench.child import emit
from bench.gpu import PRECISIONS
from bench.gpu.workload import MODES, GpuWorkload, get_workload


def parse_args(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--workload", default=None,
                        help="must match the mode's workload (passed by bench.launch)")
    parser.add_argument("--mode", choices=MODES, default="full")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32")
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None,
                        help="default: cuda when available")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps")
    parser.add_argument("--steps", type=int, default=None, help="timed steps")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after the timed steps, this many more under torch.profiler: "
                             "what the CPU waited for and how busy the GPU was (a diagnosis)")
    parser.add_argument("--no-commits", action="store_true",
                        help="raysgd variants: checkpoint_every_n_steps=None (a diagnosis: "
                             "what in-epoch commits cost)")
    return parser.parse_args()


def setup(args: argparse.Namespace) -> tuple:
    """``(workload, device)`` for these arguments; threads and cuDNN configured."""
    workload = get_workload(args.mode, args.warmup, args.steps)
    if args.workload not in (None, workload.name):
        raise SystemExit(f"--workload {args.workload} does not match mode {args.mode} "
                         f"({workload.name})")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.set_num_threads(args.threads)
    # Fixed input shapes: let cuDNN pick its fastest kernels once, for every variant alike.
    torch.backends.cudnn.benchmark = True
    return workload, device


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so the clock measures work done, not work launched."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], Any], device: torch.device) -> tuple:
    """``(seconds, run())``, synchronised on both ends."""
    sync(device)
    start = time.perf_counter()
    value = run()
    sync(device)
    return time.perf_counter() - start, value


# The CPU-side calls that wait for the GPU, or copy from it, counted by ``profiled``.
WAITS = ("aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
         "cudaMemcpyAsync", "cudaHostAlloc", "cudaEventSynchronize")


def profiled(run: Callable[[], Any], device: torch.device, steps: int) -> Dict[str, Any]:
    """``run`` (``steps`` steps) under torch.profiler: per step, the calls in ``WAITS`` (count and
    CPU time), the GPU kernels' busy time against the wall, the CPU ops that took longest in all
    and the kernels that took longest (ms and launches per step)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sync(device)
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        run()
        sync(device)
        wall = time.perf_counter() - start
    averages = prof.key_averages()
    kernels = [e for e in averages if str(getattr(e, "device_type", "")).endswith("CUDA")]
    device_us = sum(_device_us(e) for e in kernels)
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    # The kernels by name: a kernel only one side launches is work that side adds.
    top_gpu = sorted(kernels, key=_device_us, reverse=True)[:15]
    return {"steps": steps, "wall_ms_per_step": wall * 1e3 / steps,
            "gpu_busy_ms_per_step": device_us / 1e3 / steps,
            "kernels_per_step": sum(e.count for e in kernels) / steps,
            "waits_per_step": {e.key: e.count / steps for e in averages if e.key in WAITS},
            "wait_ms_per_step": {e.key: e.self_cpu_time_total / 1e3 / steps
                                 for e in averages if e.key in WAITS},
            "top_cpu_ms_per_step": {e.key: e.self_cpu_time_total / 1e3 / steps for e in top},
            "top_gpu": {e.key[:90]: [round(_device_us(e) / 1e3 / steps, 3), e.count / steps]
                        for e in top_gpu}}


def _device_us(event: Any) -> float:
    """An event's own time on the device (the attribute's name changed in torch 2.4)."""
    return (getattr(event, "self_device_time_total", None)
            or getattr(event, "self_cuda_time_total", 0) or 0)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def gpu_mem_mib(device: torch.device) -> Optional[float]:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2 ** 20


def report(workload: GpuWorkload, precision: str, device: torch.device, seconds: float,
           **extra: Any) -> None:
    """Print the ``BENCH_RESULT`` line: images/s over the timed steps plus context."""
    figures: Dict[str, Any] = {
        "images_per_s": workload.timed_steps * workload.batch_size / seconds,
        "timed_s": seconds, "precision": precision, "device": device_name(device),
        "device_type": device.type, "model": workload.name, "batch_size": workload.batch_size,
        "warmup_steps": workload.warmup_steps, "timed_steps": workload.timed_steps,
        "gpu_mem_mib": gpu_mem_mib(device), **extra}
    emit(figures)
