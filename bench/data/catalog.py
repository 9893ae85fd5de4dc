"""The Ray Data benchmark's variants, the figures each must report, and the ratios."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from bench.catalog import Variant, pick
from bench.data import RAYTRAIN_THROUGHPUT_TARGET

FIGURES = ("first_epoch_s", "steady_samples_per_s", "wall_s", "peak_mem_mib")

HEADERS = {"first_epoch_s": "launch→end of epoch 1 (s)",
           "steady_samples_per_s": "steady samples/s",
           "wall_s": "wall (s)",
           "peak_mem_mib": "peak mem (MiB)"}


@dataclass(frozen=True)
class Entry:
    variant: Variant
    figures: Tuple[str, ...] = FIGURES

    @property
    def name(self) -> str:
        return self.variant.name


_D = "bench.data."
ENTRIES: Tuple[Entry, ...] = (
    Entry(Variant("raysgd_raydata", "raysgd, datasets= (in-memory ray.data)",
                  _D + "raysgd_variant", ("--input", "raydata"))),
    Entry(Variant("raysgd_raydata_nospare", "raysgd_raydata with spare_workers=0",
                  _D + "raysgd_variant", ("--input", "raydata", "--spare-workers", "0"))),
    Entry(Variant("raysgd_loader", "raysgd, DataLoader (register_data)",
                  _D + "raysgd_variant", ("--input", "loader"))),
    Entry(Variant("raytrain_raydata", "Ray Train, datasets= + iter_torch_batches",
                  _D + "raytrain_raydata")),
)

BY_NAME = {entry.name: entry for entry in ENTRIES}

# (label, numerator, denominator, figure, target): see bench.report.compute_ratios.
RATIOS = (
    ("raysgd/Ray Train, Ray Data", "raysgd_raydata", "raytrain_raydata", "steady_samples_per_s",
     (">=", RAYTRAIN_THROUGHPUT_TARGET)),
    ("raysgd/Ray Train, Ray Data", "raysgd_raydata", "raytrain_raydata", "first_epoch_s", None),
    ("raysgd default/no spare, Ray Data", "raysgd_raydata", "raysgd_raydata_nospare",
     "steady_samples_per_s", (">=", 0.98)),
    ("raysgd Ray Data/DataLoader", "raysgd_raydata", "raysgd_loader", "steady_samples_per_s",
     None),
    ("raysgd Ray Data/DataLoader", "raysgd_raydata", "raysgd_loader", "first_epoch_s", None),
)


def select(names: List[str] = None) -> List[Entry]:
    """The entries called ``names`` (all when empty), in catalogue order."""
    return pick(ENTRIES, names)
