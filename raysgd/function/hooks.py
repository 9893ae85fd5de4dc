"""Routes ``ray.tune.report`` / ``ray.train.report`` (and ``get_checkpoint``) inside a
function trainable's workers to its :class:`~raysgd.function.session.FunctionSession`.

Both APIs look their session up in a process-wide slot that Ray fills for its own
workers: Tune's in ``ray.train._internal.session._session``, Ray Train 2's through
``set_train_fn_utils`` (documented there as the place to patch new behaviour in).
raysgd's workers are its own actors, so raysgd fills those slots. These are Ray
internals: this module is the only place that touches them, and
tests/test_func_trainable.py fails by name if a Ray upgrade moves them.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, Optional

from raysgd.function.session import FunctionSession

logger = logging.getLogger("raysgd")


def _checkpoint_path(checkpoint: Any) -> Optional[str]:
    """A local directory for a reported ``ray.train.Checkpoint`` (or a path string)."""
    if checkpoint is None:
        return None
    if isinstance(checkpoint, str):
        return checkpoint
    filesystem = getattr(checkpoint, "filesystem", None)
    if filesystem is not None and getattr(filesystem, "type_name", "local") == "local":
        return checkpoint.path
    return checkpoint.to_directory()


def _loaded_checkpoint(session: FunctionSession) -> Any:
    if session.loaded_checkpoint_dir is None:
        return None
    from ray.tune import Checkpoint

    return Checkpoint.from_directory(session.loaded_checkpoint_dir)


class _TuneSession:
    """What ``ray.tune.report`` / ``ray.tune.get_checkpoint`` / ``get_context`` read."""

    def __init__(self, session: FunctionSession, trial: Dict[str, Any]):
        self._session = session
        # Not None: Ray Train's report() refuses to run inside a Tune session (world_rank
        # None); ours serves both, so ray.train.report must see a Train worker.
        self.world_rank = session.rank
        self.world_size = session.world_size
        self.local_rank = trial.get("local_rank", 0)
        self.trial_id = trial.get("trial_id", "default")
        self.trial_name = trial.get("trial_name", "default")
        self.experiment_name = trial.get("experiment_name", "default")
        self.trial_dir = trial.get("trial_dir")
        self.trial_resources = None
        self.metadata: Dict[str, Any] = {}

    def report(self, metrics: Dict, *, checkpoint: Any = None, **_ignored: Any) -> None:
        self._session.report(metrics, _checkpoint_path(checkpoint))

    @property
    def loaded_checkpoint(self) -> Any:
        return _loaded_checkpoint(self._session)


def _train_fn_utils(session: FunctionSession, trial: Dict[str, Any]) -> Any:
    from ray.train.v2._internal.execution.train_fn_utils import LocalTrainFnUtils

    class RaySGDTrainFnUtils(LocalTrainFnUtils):
        """Ray Train 2's worker utilities, reporting to the raysgd session."""

        def report(self, metrics, checkpoint=None, *args, **kwargs):
            session.report(metrics, _checkpoint_path(checkpoint))

        def get_checkpoint(self):
            return _loaded_checkpoint(session)

        def is_distributed(self) -> bool:
            return session.world_size > 1

        def barrier(self) -> None:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.barrier()

    return RaySGDTrainFnUtils(experiment_name=trial.get("experiment_name", "raysgd"),
                              world_size=session.world_size, world_rank=session.rank,
                              local_rank=trial.get("local_rank", 0))


def fetch(checkpoint: Any) -> Any:
    """The packed checkpoint behind an object reference (the driver ``ray.put`` it once)."""
    import ray

    return ray.get(checkpoint) if isinstance(checkpoint, ray.ObjectRef) else checkpoint


def install(session: FunctionSession, trial: Dict[str, Any]) -> None:
    """Make this process's ``tune.report`` and ``ray.train.report`` reach ``session``."""
    from ray.train._internal import session as tune_session

    tune_session._session = _TuneSession(session, trial)
    try:
        from ray.train.v2._internal.execution.train_fn_utils import set_train_fn_utils
    except ImportError:  # Ray Train 2 is absent: ray.train.report keeps Ray's behaviour
        logger.debug("raysgd: Ray Train 2 not importable; only tune.report is routed")
        return
    set_train_fn_utils(_train_fn_utils(session, trial))
