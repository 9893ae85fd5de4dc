"""``FunctionOperator``: the operator a function trainable's workers run.

The worker group, placement, process group and recovery are the same as for any
operator; the operator just hosts the user's function (:mod:`raysgd.function.session`)
instead of registering models. A function owns its training state, so a commit holds
nothing of it: after a worker failure the restarted workers run the function again
from the trial's last checkpoint, which every ``next_result`` call carries.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from typing import Any, Callable, Dict, Optional

import torch.distributed as dist

from raysgd.function import hooks as func_hooks
from raysgd.function.session import FunctionSession
from raysgd.operator import TrainingOperator
from raysgd.state.dirblob import pack_dir, unpack_dir
from raysgd.worker import distributed


class FunctionOperator(TrainingOperator):
    """Runs one rank of ``func(config, checkpoint_dir)``; driven by ``next_result``."""

    cannot_shard = "the function keeps its own models; shard them inside the function."

    def setup(self, config: Dict[str, Any]) -> None:
        # No models or optimizers to hand over: the function keeps its own, and a
        # commit carries only this rank's RNG state.
        self._registered = True
        self._session: Optional[FunctionSession] = None
        self._restored_dir: Optional[str] = None

    def next_result(self, func: Callable, checkpoint: Any, trial: Dict[str, Any]) -> Dict[str, Any]:
        """The function's next report on this rank; starts the function on the first call.

        ``checkpoint`` is the trial's last checkpoint (a packed directory, or an object
        reference to one) to start from. Rank 0's result carries the checkpoint the
        function made since its last report, packed.
        """
        if self._session is None:
            self._session = self._start(func, checkpoint, trial)
        result = self._session.next_result()
        path = result.pop("checkpoint_dir")
        result["checkpoint"] = None
        if path is not None and self.world_rank == 0:
            result["checkpoint"] = pack_dir(path)
            if os.path.basename(path).startswith("raysgd_checkpoint_"):
                shutil.rmtree(path, ignore_errors=True)  # ours (distributed_checkpoint_dir)
        return result

    def _start(self, func: Callable, checkpoint: Any, trial: Dict[str, Any]) -> FunctionSession:
        if checkpoint is not None:
            self._restored_dir = unpack_dir(func_hooks.fetch(checkpoint),
                                            tempfile.mkdtemp(prefix="raysgd_restored_"))
            # Deleted with the operator (the runner drops it at shutdown) or at exit.
            weakref.finalize(self, shutil.rmtree, self._restored_dir, True)
        if not dist.is_initialized():
            # Ray 1.x gave a one-worker trial a process group too, so DDP(model) works.
            distributed.init_single_process_group(self._context.settings.backend)
        session = FunctionSession(func, dict(self.config), self.world_rank, self.world_size,
                                  self._restored_dir)
        func_hooks.install(session, {**trial, "local_rank": self.local_rank})
        return session
