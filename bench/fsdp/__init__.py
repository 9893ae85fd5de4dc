"""``python -m bench.fsdp`` (``make bench-fsdp``): sharded training against its peers.

Variants (each its own subprocess, see ``bench/README.md``): raysgd FSDP, a hand-written
torchrun FSDP2 loop and raysgd DDP on the same residual-MLP workload (throughput), raysgd
FSDP and DDP at 2 and 4 workers (per-rank peak memory, bytes each rank puts per commit),
a SIGKILLed rank under FSDP and DDP with a warm spare, with a spare that may still be
warming, and without one (``bench.recovery``'s kill variant), and Ray Train's FSDP path
(which needs GPUs: the run records its error on CPU).
"""
