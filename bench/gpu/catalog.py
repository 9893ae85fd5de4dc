"""The GPU mode's variants, the figures each run must report, and its ratios."""
from __future__ import annotations

from typing import List, Tuple

from bench.catalog import Variant, pick
from bench.gpu import PRECISIONS, RAYSGD_USE_FP16

# Every ok run holds these (wall_s and peak_mem_mib come from the parent).
FIGURES = ("images_per_s", "wall_s", "peak_mem_mib")
# Shown when every ok run has them: GPU memory exists on CUDA only, the loss
# scale for fp16 only.
OPTIONAL_FIGURES = ("gpu_mem_mib", "loss_scale")

HEADERS = {"images_per_s": "images/s", "gpu_mem_mib": "peak GPU mem (MiB)",
           "loss_scale": "loss scale", "wall_s": "wall (s)", "peak_mem_mib": "peak mem (MiB)"}


def _trio(precision: str) -> Tuple[Variant, Variant, Variant]:
    use_fp16 = f"use_fp16={RAYSGD_USE_FP16[precision]!r}"
    raysgd = Variant(f"raysgd_{precision}", f"raysgd 1 worker (use_local), {use_fp16}",
                     "bench.gpu.raysgd_amp", ("--precision", precision))
    lightning = Variant(f"raysgd_lightning_{precision}",
                        f"raysgd as raysgd_{precision}, a LightningModule (from_ptl) that logs "
                        "its loss", "bench.gpu.raysgd_lightning", ("--precision", precision))
    extra = {"fp32": "", "fp16": "autocast + GradScaler", "bf16": "autocast"}[precision]
    loop = Variant(f"loop_{precision}", f"hand-written loop, {precision} {extra}".rstrip(),
                   "bench.gpu.loop_amp", ("--precision", precision))
    return raysgd, lightning, loop


# Each raysgd variant sits next to the loop it is compared with, so they run
# back to back and share whatever drift (clocks, heat) there is.
VARIANTS: Tuple[Variant, ...] = tuple(v for p in PRECISIONS for v in _trio(p))
# Run only when named: raysgd without in-epoch commits, to tell a commit's cost from a step's.
DIAGNOSES: Tuple[Variant, ...] = tuple(
    Variant(f"raysgd_{p}_no_commits", f"raysgd as raysgd_{p}, no in-epoch commits (diagnosis)",
            "bench.gpu.raysgd_amp", ("--precision", p, "--no-commits")) for p in PRECISIONS)
BY_NAME = {variant.name: variant for variant in VARIANTS + DIAGNOSES}

# (label, numerator, denominator, figure, target); see bench.report.compute_ratios.
# Targets are reported, never enforced.
RATIOS = tuple(
    [(f"raysgd/loop {p}", f"raysgd_{p}", f"loop_{p}", "images_per_s", (">=", 0.98))
     for p in PRECISIONS]
    + [(f"raysgd lightning/loop {p}", f"raysgd_lightning_{p}", f"loop_{p}", "images_per_s",
        None) for p in PRECISIONS]
    + [(f"loop {p}/fp32", f"loop_{p}", "loop_fp32", "images_per_s", None)
       for p in PRECISIONS if p != "fp32"]
    + [(f"raysgd no in-epoch commits/loop {p}", f"raysgd_{p}_no_commits", f"loop_{p}",
        "images_per_s", None) for p in PRECISIONS])


def select(names: List[str] = None) -> List[Variant]:
    """The variants called ``names`` (all but the diagnoses when empty), in catalogue order."""
    return pick(VARIANTS + DIAGNOSES if names else VARIANTS, names)
