"""Variant: the hand-written loop in one process (no framework, no process group)."""
from bench.child import Figures, emit, parse_args, set_threads
from bench.loop import run_epochs
from bench.workloads import get_workload


def main() -> None:
    args = parse_args(__doc__)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    figures = Figures(workload)
    model = workload.model()
    run_epochs(model, workload.optimizer(model), workload.criterion(),
               workload.loader(workload.batch_size), figures)
    emit(figures.as_dict())


if __name__ == "__main__":
    main()
