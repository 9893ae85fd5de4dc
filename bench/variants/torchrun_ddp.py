"""Variant: the hand-written loop under ``torchrun``, DDP on gloo (run one per rank)."""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from bench.child import Figures, emit, leave_process_group, parse_args, set_threads
from bench.loop import run_epochs
from bench.workloads import get_workload


def main() -> None:
    args = parse_args(__doc__)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    figures = Figures(workload)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model = DistributedDataParallel(workload.model())
    dataset = workload.dataset()
    loader = DataLoader(dataset, batch_size=workload.batch_size // world,
                        sampler=DistributedSampler(dataset, shuffle=True))
    run_epochs(model, workload.optimizer(model), workload.criterion(), loader, figures)
    if dist.get_rank() == 0:
        emit(figures.as_dict())
    leave_process_group()


if __name__ == "__main__":
    main()
