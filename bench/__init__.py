"""Side-by-side benchmarks: raysgd against torchrun DDP, Ray Train and a plain loop.

``python -m bench`` runs every variant as its own subprocess, several times in
rotating order, and prints a table plus the ratios the project tracks. See
``bench/README.md``.

Protocol between the parent and a variant subprocess:

* the parent sets ``BENCH_T0`` (``time.time()`` just before launching it) so the
  child can report the time from process launch to its first completed step;
* the child prints exactly one line ``BENCH_RESULT {json}`` with its figures.
"""

T0_ENV = "BENCH_T0"
RESULT_MARKER = "BENCH_RESULT "
