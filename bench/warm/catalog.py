"""The warm-worker benchmark's variants, the figures each must report, ratios and targets."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from raysgd.commits.interval import START as COMMIT_EVERY  # "auto"'s first interval

from bench.catalog import Variant, pick
from bench.recovery import catalog as recovery
from bench.warm import RECOVERY_WITH_SPARE_TARGET_S, SECOND_TRAINER_TARGET_S

SECOND_FIGURES = ("first_trainer_s", "second_trainer_s", "same_pids", "reused_workers",
                  "shutdown_s", "launch_first_step_s", "wall_s", "peak_mem_mib")
TUNE_FIGURES = ("total_s", "per_trial_s", "trials_done", "distinct_worker_pids",
                "distinct_trainable_pids", "wall_s", "peak_mem_mib")

HEADERS = {"first_trainer_s": "trainer #1 ctor→first step (s)",
           "second_trainer_s": "trainer #2 ctor→first step (s)",
           "same_pids": "#2 same pids",
           "reused_workers": "workers reused",
           "shutdown_s": "#1 shutdown (s)",
           "launch_first_step_s": "launch→first step (s)",
           "total_s": "fit() total (s)",
           "per_trial_s": "per trial (s)",
           "trials_done": "trials",
           "distinct_worker_pids": "worker pids seen",
           "distinct_trainable_pids": "trainable pids seen",
           "wall_s": "wall (s)",
           "peak_mem_mib": "peak mem (MiB)",
           **recovery.HEADERS}


@dataclass(frozen=True)
class Entry:
    variant: Variant
    kind: str  # "second", "tune" or "recovery": which table shows it
    figures: Tuple[str, ...]
    full_repeats: Optional[int] = None  # full mode's default repetitions, if not the suite's

    @property
    def name(self) -> str:
        return self.variant.name


_W = "bench.warm."
# The recovery benchmark's kill runs, also shown here (its quick run already makes them, so
# the smoke tests leave them out of this one's: see tests/bench_runs.py).
RECOVERY_RUNS = ("raysgd_recovery", "raysgd_recovery_nospare")
ENTRIES: Tuple[Entry, ...] = (
    Entry(Variant("second_reuse", "2nd raysgd trainer, warm pool (default)",
                  _W + "second_trainer"), "second", SECOND_FIGURES),
    Entry(Variant("second_noreuse", "2nd raysgd trainer, reuse_workers=False",
                  _W + "second_trainer", ("--no-reuse",)), "second", SECOND_FIGURES),
    # A Ray Train trial costs 10-25 s on 2 cores: one full-mode run of each by default.
    Entry(Variant("tune_raysgd", "raysgd as_trainable, Tune reuse_actors=True",
                  _W + "tune_raysgd"), "tune", TUNE_FIGURES, full_repeats=1),
    Entry(Variant("tune_raytrain", "Ray Train TorchTrainer in a Tune function",
                  _W + "tune_raytrain"), "tune", TUNE_FIGURES, full_repeats=1),
    # The kill once the spare has warmed up (in a long run's idle moments, or on a free core);
    # the recovery benchmark's own two kill runs below come while a spare may still warm.
    Entry(Variant("raysgd_recovery_warm",
                  f"raysgd, commit every {COMMIT_EVERY} steps, the kill once the spare "
                  "is warm", "bench.recovery.raysgd_kill",
                  ("--commit-every", str(COMMIT_EVERY), "--warm-spare")),
          "recovery", recovery.RAYSGD_RECOVERY_FIGURES),
    *(Entry(recovery.BY_NAME[name].variant, "recovery", recovery.BY_NAME[name].figures)
      for name in RECOVERY_RUNS),
)

BY_NAME = {entry.name: entry for entry in ENTRIES}

# (label, numerator, denominator, figure, target): see bench.report.compute_ratios.
RATIOS = (
    ("2nd trainer reuse/no reuse", "second_reuse", "second_noreuse", "second_trainer_s", None),
    ("2nd/1st trainer (reuse)", "second_reuse", "second_reuse",
     ("second_trainer_s", "first_trainer_s"), None),
    ("Tune raysgd/Ray Train", "tune_raysgd", "tune_raytrain", "total_s", None),
    ("recovery spare/no spare", "raysgd_recovery", "raysgd_recovery_nospare", "recovery_s",
     None),
    ("recovery warm spare/no spare", "raysgd_recovery_warm", "raysgd_recovery_nospare",
     "recovery_s", None),
)

# (label, variant, figure, short name, target): the absolute targets, on the median.
TARGETS = (
    ("2nd trainer, warm pool", "second_reuse", "second_trainer_s", "#2",
     ("<=", SECOND_TRAINER_TARGET_S)),
    ("recovery with a warm spare", "raysgd_recovery_warm", "recovery_s", "kill→next step",
     ("<=", RECOVERY_WITH_SPARE_TARGET_S)),
    ("recovery with a spare that may still warm", "raysgd_recovery", "recovery_s",
     "kill→next step", ("<=", RECOVERY_WITH_SPARE_TARGET_S)),
)


def select(names: List[str] = None) -> List[Entry]:
    """The entries called ``names`` (all when empty), in catalogue order."""
    return pick(ENTRIES, names)
