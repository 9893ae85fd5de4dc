"""One torchrun rank of the chaos benchmark: DDP on gloo, a checkpoint file every N steps.

What a careful hand-written loop does (the path Lightning and Accelerate users take under
torchrun): rank 0 saves model, optimizer and step every ``--every`` steps; on SIGTERM (a
preemption notice) the rank that got it saves at the end of its step and exits, so
``torchrun --max-restarts`` restarts every rank from that file.

SIGTERM is taken by a thread (``sigwait``), not a Python handler: a handler runs only when
the main thread is back in the interpreter, and a rank whose peer died waits inside a gloo
collective, so torchrun's own SIGTERM (stopping the group to restart it) would then wait for
its 30 s kill timeout. A rank that has not saved and exited within ``GRACE_S`` exits anyway.
"""
import os
import signal
import threading
import time

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from bench.chaos.loop import load_state, save_state, train_steps
from bench.chaos.ranklog import ChaosLog
from bench.child import parse_args, set_threads
from bench.workloads import get_workload


GRACE_S = 0.5


def _die() -> None:
    """Exit at once: nothing in this process needs cleaning up."""
    os.kill(os.getpid(), signal.SIGKILL)


def _watch_sigterm(noticed: threading.Event) -> None:
    """Block SIGTERM in every thread (call before any other starts) and take it here."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def _wait() -> None:
        signal.sigwait({signal.SIGTERM})
        noticed.set()
        time.sleep(GRACE_S)
        _die()  # blocked in a collective: no step will end to save at

    threading.Thread(target=_wait, daemon=True, name="sigterm").start()


def _init_group() -> None:
    """The default group, on torchrun's store with this attempt's own key prefix.

    Without the prefix, a group restarted by torchrun 2.13 sometimes read the previous
    attempt's gloo addresses from the agent's store, timed out connecting to them and failed
    again, every attempt after (seen in this benchmark: a run stuck for the rest of its
    window). A careful loop works around it this way."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}/", store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))


def peer_args(parser) -> None:
    """The options the chaos runners give a peer's rank (torchrun's loop, torchft's)."""
    parser.add_argument("--step-dir", required=True)
    parser.add_argument("--checkpoint", required=True, help="the checkpoint file")
    parser.add_argument("--every", type=int, required=True, help="checkpoint every N steps")


def main() -> None:
    args = parse_args(__doc__, peer_args)
    noticed = threading.Event()
    _watch_sigterm(noticed)
    set_threads(args.threads)
    workload = get_workload(args.workload, args.mode)
    _init_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    log = ChaosLog(args.step_dir, f"node{rank}")
    model = workload.model()
    optimizer = workload.optimizer(model)
    start = load_state(args.checkpoint, model, optimizer)
    ddp = DistributedDataParallel(model)
    dataset = workload.dataset()
    loader = DataLoader(dataset, batch_size=workload.batch_size // world,
                        sampler=DistributedSampler(dataset, shuffle=True))

    def on_step(step: int) -> None:
        log.completed(rank, step)
        if (rank == 0 and step % args.every == 0) or noticed.is_set():
            save_state(args.checkpoint, model, optimizer, step)
        if noticed.is_set():
            _die()  # torchrun sees a failed rank and restarts the group

    train_steps(ddp, optimizer, workload.criterion(), loader, start, on_step)


if __name__ == "__main__":
    main()
