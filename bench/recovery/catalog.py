"""The recovery benchmark's variants, the figures each must report, and its ratios."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from raysgd.commits.interval import START as COMMIT_EVERY  # "auto"'s first interval

from bench.catalog import Variant, pick

DENSE_COMMIT_EVERY = 10

# Figures every run of a kind must hold to count as ok (wall_s and peak_mem_mib
# come from the parent, the others from the variant's BENCH_RESULT line).
RECOVERY_FIGURES = ("recovery_s", "steps_rerun", "commit_interval", "first_step_s",
                    "wall_s", "peak_mem_mib")
RAYSGD_RECOVERY_FIGURES = RECOVERY_FIGURES + ("recovery_reported_s", "steps_lost_reported")
THROUGHPUT_FIGURES = ("steady_samples_per_s", "first_step_s", "wall_s", "peak_mem_mib")
PREEMPT_FIGURES = ("notice_to_step_s", "steps_rerun", "first_step_s", "wall_s", "peak_mem_mib")

HEADERS = {"recovery_s": "kill→next step (s)",
           "notice_to_step_s": "notice→step elsewhere (s)",
           "recovery_reported_s": "raysgd's own (s)",
           "steps_rerun": "steps re-run",
           "steps_lost_reported": "steps lost (raysgd)",
           "commit_interval": "commit interval",
           "steady_samples_per_s": "steady samples/s",
           "first_step_s": "first step (s)",
           "wall_s": "wall (s)",
           "peak_mem_mib": "peak mem (MiB)",
           "steps_rerun/commit_interval": "steps re-run / interval"}


@dataclass(frozen=True)
class Entry:
    variant: Variant
    kind: str  # "recovery", "preemption" or "throughput"
    figures: Tuple[str, ...]

    @property
    def name(self) -> str:
        return self.variant.name


_R = "bench.recovery."
ENTRIES: Tuple[Entry, ...] = (
    Entry(Variant("raysgd_recovery",
                  f"raysgd, commit every {COMMIT_EVERY} steps, spare worker (default)",
                  _R + "raysgd_kill", ("--commit-every", str(COMMIT_EVERY))),
          "recovery", RAYSGD_RECOVERY_FIGURES),
    Entry(Variant("raysgd_recovery_nospare",
                  f"raysgd, commit every {COMMIT_EVERY} steps, spare_workers=0",
                  _R + "raysgd_kill", ("--commit-every", str(COMMIT_EVERY),
                                       "--spare-workers", "0")),
          "recovery", RAYSGD_RECOVERY_FIGURES),
    Entry(Variant("raytrain_recovery",
                  "Ray Train, checkpoint every epoch",
                  _R + "raytrain_kill", ("--max-failures", "3")),
          "recovery", RECOVERY_FIGURES),
    Entry(Variant("raysgd_preempt",
                  "raysgd defaults, 3-node cluster, node drained (15 s deadline; quick: 10 s)",
                  _R + "raysgd_preempt", ()),
          "preemption", PREEMPT_FIGURES),
    Entry(Variant("raytrain_preempt",
                  "Ray Train, epoch checkpoints + just-in-time one on notice, same drain",
                  _R + "raytrain_preempt", ()),
          "preemption", PREEMPT_FIGURES),
    Entry(Variant("raysgd_commit_none", "raysgd, commits at train() ends only",
                  _R + "raysgd_commit", ("--commit-every", "none")),
          "throughput", THROUGHPUT_FIGURES),
    Entry(Variant("raysgd_commit_default",
                  f"raysgd, commit every {COMMIT_EVERY} steps (auto's first interval)",
                  _R + "raysgd_commit", ("--commit-every", str(COMMIT_EVERY))),
          "throughput", THROUGHPUT_FIGURES + ("commit_interval",)),
    Entry(Variant(f"raysgd_commit_{DENSE_COMMIT_EVERY}",
                  f"raysgd, commit every {DENSE_COMMIT_EVERY} steps",
                  _R + "raysgd_commit", ("--commit-every", str(DENSE_COMMIT_EVERY))),
          "throughput", THROUGHPUT_FIGURES + ("commit_interval",)),
)

BY_NAME = {entry.name: entry for entry in ENTRIES}

# (label, numerator, denominator, figure or (num figure, den figure), target);
# see bench.report.compute_ratios. Targets are reported, never enforced. The
# issue's absolute target for raysgd_recovery's kill→next step (<= 1.0 s with a
# spare) does not fit a ratio; ``python -m bench.warm`` prints it.
RATIOS = (
    ("raysgd/Ray Train", "raysgd_recovery", "raytrain_recovery", "recovery_s", ("<=", 0.5)),
    ("raysgd/Ray Train", "raysgd_recovery", "raytrain_recovery", "steps_rerun", None),
    ("raysgd spare/no spare", "raysgd_recovery", "raysgd_recovery_nospare", "recovery_s", None),
    # Without a spare the survivors stay and a new process takes the dead rank (target: the
    # kill→next step itself <= 3.0 s, read from the table).
    ("raysgd no spare/Ray Train", "raysgd_recovery_nospare", "raytrain_recovery", "recovery_s",
     None),
    ("raysgd re-run/interval", "raysgd_recovery", "raysgd_recovery",
     ("steps_rerun", "commit_interval"), ("<=", 1.0)),
    ("Ray Train re-run/interval", "raytrain_recovery", "raytrain_recovery",
     ("steps_rerun", "commit_interval"), None),
    ("raysgd/Ray Train preempted", "raysgd_preempt", "raytrain_preempt", "notice_to_step_s",
     None),
    ("commit default/none", "raysgd_commit_default", "raysgd_commit_none",
     "steady_samples_per_s", (">=", 0.97)),
    (f"commit {DENSE_COMMIT_EVERY}/none", f"raysgd_commit_{DENSE_COMMIT_EVERY}",
     "raysgd_commit_none", "steady_samples_per_s", None),
)


def select(names: List[str] = None) -> List[Entry]:
    """The entries called ``names`` (all when empty), in catalogue order."""
    return pick(ENTRIES, names)
