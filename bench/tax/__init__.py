"""Tax benchmark: what raysgd's fault tolerance costs every step (``make bench-tax``).

``python -m bench.tax [--quick] [--gpu] [--sizes small,medium,large] [--strategies ddp,fsdp]
[--repeats N] [--out PATH]`` runs, per cell (strategy × size), raysgd's ``TorchTrainer`` with
its defaults beside a hand-written torchrun loop of the same model, data, sampler, batch and
Adam, each run in a fresh process tree, raysgd and loop interleaved; then one run with rank 1
SIGKILLed (``bench.recovery.raysgd_kill``). See bench/README.md, "Tax benchmark".

Protocol with the children as in ``bench`` (``BENCH_T0``, one ``BENCH_RESULT`` line).
"""

SIZES = ("small", "medium", "large")
STRATEGIES = ("ddp", "fsdp")
RANKS = 2  # on CPU, every cell


def workload_name(size: str) -> str:
    """The ``bench.workloads`` entry of a size (its quick and full shapes)."""
    return "tax_" + size


def cell_args(parser) -> None:
    """The options the cell's children take beside ``bench.child.parse_args``'s."""
    parser.add_argument("--strategy", choices=STRATEGIES, default="ddp")
    parser.add_argument("--gpu", action="store_true",
                        help="the ranks on the machine's GPU, shared (see ranks())")


def ranks(strategy: str, gpu: bool) -> int:
    """Ranks of a cell. ``--gpu`` shares the machine's one GPU: DDP's two ranks on gloo (NCCL
    refuses two ranks on one device), FSDP's one rank on NCCL, as ``python -m bench.fsdp
    --gpu`` runs it."""
    return 1 if gpu and strategy == "fsdp" else RANKS
