"""Function trainables: Tune trials that run ``func(config, checkpoint_dir)`` on every
rank of a ``TorchTrainer``.

``trainable`` (driver, Tune) builds the trial and its trainer; on the workers,
``operator`` hosts one rank's ``session`` (the function in a thread, in lockstep
with the driver) and ``hooks`` points Ray's ``report`` at it. The legacy path of
these names is ``raysgd.torch.func_trainable``.
"""
