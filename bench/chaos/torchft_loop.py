"""One torchft replica group of the chaos benchmark (one process, started by its torchrun).

torchft's DDP recipe on gloo: a ``Manager`` that asks the lighthouse for a quorum every step,
gradients averaged over the replica groups in the quorum with ``manager.allreduce`` (one
flat buffer per step) and torchft's ``Optimizer`` (a step only where every participant's
``should_commit`` voted yes), each group reading its own shard of the data
(``torchft.data.DistributedSampler``). Not torchft's ``DistributedDataParallel`` wrapper: in
torchft 0.2.0 its gradient hook fails an assertion (``ddp.py``, ``assert fut._fut``) when a
peer dies inside the all-reduce, which kills the survivor too (seen here); the manager's own
all-reduce reports that error to the step's vote instead, as torchft intends. A
group that dies is left out of the next quorum and the survivors go on; its restarted
process heals from a healthy peer (state and step sent over the process group). For the case
where every group dies, the lowest participating group writes a checkpoint to disk every
``--every`` steps, as torchft's docs advise, and a group that finds no peer resumes from it.

Progress is logged in **per-group batches** committed by the whole job
(``manager.batches_committed()``: the participants of every committed step), which the
runner turns into samples with the per-group batch. Every group may log: a line is appended
(under a file lock) only when it moves the count forward, so the log reads as one trainer's.

A SIGTERM (a preemption notice) ends the process at once: torchft has no use for a notice,
and its agent restarts the group as after a kill.
"""
import fcntl
import os
import signal
import time
from datetime import timedelta

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.utils.data import DataLoader

from bench.chaos.loop import save_state
from bench.chaos.torchrun_loop import peer_args
from bench.child import parse_args, set_threads
from bench.recovery.steplog import LOG_NAME, node_path, pid_path, write_text
from bench.workloads import get_workload

GROUPS_ENV, GROUP_ENV = "NUM_REPLICA_GROUPS", "REPLICA_GROUP_ID"


class SharedProgress:
    """``log.advance(count)``: append ``count wall pid`` to the step log if no group logged
    ``count`` (or more) yet."""

    def __init__(self, directory: str, group: int):
        write_text(pid_path(directory, group), str(os.getpid()))
        write_text(node_path(directory, group), f"group{group}")
        self._path, self._pid, self._last = os.path.join(directory, LOG_NAME), os.getpid(), 0

    def advance(self, count: int) -> None:
        if count <= self._last:
            return
        self._last = count
        with open(self._path, "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 64))
            tail = handle.read().splitlines()
            last = int(tail[-1].split()[0]) if tail and tail[-1].split() else 0
            if count > last:
                handle.write(f"{count} {time.time():.6f} {self._pid}\n")
                handle.flush()


def main() -> None:
    from torchft import Manager, Optimizer, ProcessGroupGloo
    from torchft.checkpointing.pg_transport import PGTransport
    from torchft.data import DistributedSampler

    args = parse_args(__doc__, peer_args)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    set_threads(args.threads)
    group, groups = int(os.environ[GROUP_ENV]), int(os.environ[GROUPS_ENV])
    workload = get_workload(args.workload, args.mode)
    model = workload.model()
    inner = workload.optimizer(model)

    def state_dict():
        return {"model": model.state_dict(), "optimizer": inner.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optimizer"])

    pg = ProcessGroupGloo(timeout=timedelta(seconds=5))
    manager = Manager(pg=pg, min_replica_size=1, load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"chaos_{group}",
                      timeout=timedelta(seconds=30),
                      checkpoint_transport=PGTransport(pg, timeout=timedelta(seconds=10),
                                                       device=torch.device("cpu")))
    if os.path.exists(args.checkpoint):  # used only if no healthy peer heals this group
        saved = torch.load(args.checkpoint)
        load_state_dict(saved)
        manager.load_state_dict(saved["manager"])
    optimizer = Optimizer(manager, inner)
    dataset = workload.dataset()
    sampler = DistributedSampler(dataset, replica_rank=group, num_replica_groups=groups,
                                 group_rank=0, num_replicas=1, shuffle=True)
    loader = DataLoader(dataset, batch_size=workload.batch_size // groups, sampler=sampler)
    criterion, log = workload.criterion(), SharedProgress(args.step_dir, group)
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        for inputs, targets in loader:
            before = manager.current_step()
            optimizer.zero_grad()  # starts this step's quorum
            criterion(model(inputs), targets).backward()
            _average_gradients(manager, model)
            optimizer.step()  # steps only where every participant voted to commit
            step = manager.current_step()
            if step <= before:
                continue
            log.advance(manager.batches_committed())
            if step % args.every == 0 and manager.participating_rank() == 0:
                save_state(args.checkpoint, model, inner, step, manager=manager.state_dict())
        epoch += 1


def _average_gradients(manager, model) -> None:
    """Every gradient averaged over the quorum in one all-reduce (a failed one is reported to
    the manager, whose vote then discards the step)."""
    grads = [param.grad for param in model.parameters() if param.grad is not None]
    flat = _flatten_dense_tensors(grads)
    manager.allreduce(flat).wait()
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
        grad.copy_(reduced)


if __name__ == "__main__":
    main()
