"""Metrics and config as a Weights & Biases run.

The run is started with ``reinit="create_new"`` and only used through its own
object (``run.log``, ``run.finish``): several trainers, or the user's own
``wandb.run``, coexist in one process. wandb is imported in ``setup``.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from raysgd.errors import ConfigError
from raysgd.loggers.base import Logger, flatten_config, is_number


class WandbLogger(Logger):
    """One W&B run per trainer; ``init_kwargs`` go to ``wandb.init`` as they are.

    Every record carries ``global_step``, the trainer's step. W&B's own
    ``_step`` follows it too, but shifted forward after a resume: W&B drops
    records whose step goes back (see :class:`StepMap`).
    """

    def __init__(self, project: str = "raysgd", name: Optional[str] = None,
                 mode: Optional[str] = None, dir: Optional[str] = None,
                 **init_kwargs: Any) -> None:
        self.project, self.name, self.mode, self.dir = project, name, mode, dir
        self.init_kwargs = init_kwargs
        self.run: Any = None
        self.steps = StepMap()

    def setup(self, run_dir: Optional[str], resumed_step: int) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("WandbLogger needs wandb: pip install wandb") from exc
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("reinit", "create_new")  # leave other runs and wandb.run alone
        try:
            self.run = wandb.init(project=self.project, name=self.name, mode=self.mode,
                                  dir=self.dir or run_dir, **kwargs)
        except wandb.errors.UsageError as exc:  # e.g. online without an API key
            raise ConfigError(f"WandbLogger could not start a run: {exc} (or log locally: "
                              "WandbLogger(mode='offline'))") from exc
        self.steps = StepMap(first=_next_step(self.run))

    def log_hyperparams(self, config: Dict[str, Any]) -> None:
        self.run.config.update(flatten_config(config), allow_val_change=True)

    def log_metrics(self, metrics: Dict[str, float], step: int) -> None:
        data = {k: v for k, v in metrics.items() if is_number(v)}
        data["global_step"] = step
        self.run.log(data, step=self.steps.wandb_step(step))

    def finalize(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


class StepMap:
    """Maps trainer steps to W&B steps, which must never go back.

    W&B merges records of one step into one row and drops (with a warning)
    records logged at a step below its current one. Logging those without a
    step is no better: they merge into, and overwrite, the last row. So after
    a resume the trainer's steps are shifted past the last W&B step; records
    that share a trainer step still share a row.
    """

    def __init__(self, first: int = 0) -> None:
        self.offset = 0
        self.next = first  # the smallest W&B step that starts a new row
        self.last: Optional[Tuple[int, int]] = None  # (trainer step, W&B step)

    def wandb_step(self, step: int) -> int:
        if self.last is not None and self.last[0] == step:
            return self.last[1]  # e.g. validate() after train(): same row
        if step + self.offset < self.next:
            self.offset = self.next - step
        self.last = (step, step + self.offset)
        self.next = self.last[1] + 1
        return self.last[1]


def _next_step(run: Any) -> int:
    # A run resumed with init_kwargs id=..., resume=... starts past step 0.
    try:
        return int(run.step)
    except Exception:  # a "shared"-mode run has no step of its own
        return 0
