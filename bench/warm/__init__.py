"""Warm-worker benchmark (issue 14): what a trainer costs when workers already exist.

``python -m bench.warm [--quick] [--out PATH]`` (or ``python -m bench --warm``)
runs, each as its own subprocess with repetitions in rotating order:

* ``second_reuse`` / ``second_noreuse``: two raysgd trainers one after the other
  in one process; the second one's constructor → first step, with the driver's
  warm worker pool (the default) and with ``reuse_workers=False``;
* ``tune_raysgd`` / ``tune_raytrain``: 8 Tune trials of one epoch each, one at a
  time, through ``TorchTrainer.as_trainable`` (Tune's ``reuse_actors=True``)
  and through Ray Train's ``TorchTrainer`` run inside a Tune function;
* ``raysgd_recovery_warm``: the recovery benchmark's kill run
  (``bench.recovery.raysgd_kill``) with raysgd's default spare, killed only once
  the spare has finished warming up (``--warm-spare``);
* ``raysgd_recovery`` / ``raysgd_recovery_nospare``: the same kill run as the
  recovery benchmark makes it (the spare may still be warming when the kill
  comes on two busy cores) and with ``spare_workers=0``.

See ``bench/README.md`` ("Warm workers") for the figures and targets.
"""

# Absolute targets of the issue, in seconds (printed beside the figures, never enforced).
SECOND_TRAINER_TARGET_S = 1.0
RECOVERY_WITH_SPARE_TARGET_S = 1.0

# Tune variants: trials per run (the issue asks for 8; quick mode is a smoke check),
# each one epoch of the bench MLP at its quick size, whatever --mode says.
TUNE_TRIALS = {"quick": 2, "full": 8}
TUNE_WORKLOAD_MODE = "quick"
