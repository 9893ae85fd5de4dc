"""Goodput under chaos: one seeded failure schedule, four trainers, useful work per second.

``python -m bench.chaos [--quick]`` (``make bench-chaos``) trains the bench MLP on 2 workers
with raysgd, Ray Train, a hand-written torchrun DDP loop and torchft's DDP recipe (two
replica groups of one process), each in a fresh process tree,
for a fixed wall window while :mod:`bench.chaos.inject` applies the same Poisson schedule of
failures to each: a rank's process SIGKILLed, a node lost, a node preempted with notice.
Goodput is the distinct samples trained in the window over what an unfaulted torchrun run
trains in the same time. See ``bench/README.md`` ("Goodput under chaos").
"""

NUM_WORKERS = 2
# The wall window each run trains in, and the shorter one of the unfaulted runs that give
# each trainer's steady samples/s (and torchrun's, the goodput denominator).
WINDOW_S = 120.0
UNFAULTED_WINDOW_S = 45.0
# Mean times between failures (s): Poisson arrivals, one schedule per seed.
MTBFS_S = (60.0, 20.0)
NOTICE_S = 15.0  # a preemption's notice: drained (Ray) or SIGTERM (torchrun), gone after it
SEED = 2026

# --quick: the suite's smoke run, one short window at one rate.
QUICK_WINDOW_S = 30.0
QUICK_UNFAULTED_WINDOW_S = 15.0
QUICK_MTBF_S = 10.0
QUICK_NOTICE_S = 5.0
