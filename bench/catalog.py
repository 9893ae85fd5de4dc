"""Which variants exist and the command line that starts each one."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple


@dataclass(frozen=True)
class Variant:
    """One way of running the workload, started as its own process."""

    name: str
    label: str
    module: str
    args: Tuple[str, ...] = ()
    threads: int = 1
    torchrun_procs: int = 0  # > 0: start the module under torchrun with that many ranks

    def command(self, workload: str, mode: str) -> List[str]:
        launcher = [sys.executable]
        if self.torchrun_procs:
            launcher += ["-m", "torch.distributed.run", "--standalone",
                         f"--nproc_per_node={self.torchrun_procs}"]
        return [*launcher, "-m", self.module, "--workload", workload, "--mode", mode,
                "--threads", str(self.threads), *self.args]


_V = "bench.variants."
VARIANTS: Tuple[Variant, ...] = (
    Variant("raysgd_2w", "raysgd TorchTrainer, 2 workers", _V + "raysgd_trainer",
            ("--num-workers", "2")),
    Variant("raysgd_2w_nospare", "raysgd_2w with spare_workers=0", _V + "raysgd_trainer",
            ("--num-workers", "2", "--spare-workers", "0")),
    Variant("torchrun_2w", "torchrun DDP (gloo), 2 ranks", _V + "torchrun_ddp",
            torchrun_procs=2),
    Variant("raytrain_2w", "Ray Train TorchTrainer, 2 workers", _V + "ray_train",
            ("--num-workers", "2")),
    Variant("plain_1t", "plain loop, 1 thread", _V + "plain"),
    Variant("plain_2t", "plain loop, 2 threads", _V + "plain", threads=2),
    Variant("raysgd_1w", "raysgd 1 worker (use_local)", _V + "raysgd_trainer",
            ("--num-workers", "1", "--use-local")),
    Variant("raysgd_2w_plain_init", "raysgd_2w after a plain ray.init()",
            _V + "raysgd_plain_init", ("--num-workers", "2")),
)

BY_NAME = {variant.name: variant for variant in VARIANTS}


def pick(items: Sequence, names: Optional[List[str]] = None) -> list:
    """The ``items`` (anything with a ``name``) called ``names``, all when empty, in order."""
    if not names:
        return list(items)
    known = {item.name for item in items}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {sorted(known)}")
    return [item for item in items if item.name in names]


def select(names: List[str] = None) -> List[Variant]:
    """The variants called ``names`` (all when empty), in catalogue order."""
    return pick(VARIANTS, names)
