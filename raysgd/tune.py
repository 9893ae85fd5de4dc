"""Ray Tune integration. Not built yet: it arrives with Tune support (issue #6).

Kept importable so legacy imports of ``BaseTorchTrainable`` resolve; using it
raises a clear error instead of failing somewhere inside Tune.
"""
from __future__ import annotations

_NOT_YET = ("raysgd's Ray Tune integration (BaseTorchTrainable, TorchTrainer.as_trainable) "
            "arrives with Tune support and is not available in this version. Drive "
            "TorchTrainer.train()/validate() from your own loop until then.")


class BaseTorchTrainable:
    """Placeholder for the legacy Tune trainable; raises until Tune support lands."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(_NOT_YET)


def as_trainable(trainer_cls, *args, **kwargs):
    raise NotImplementedError(_NOT_YET)
