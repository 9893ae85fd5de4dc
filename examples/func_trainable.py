"""A plain DDP training function under Ray Tune: two learning rates, 2 workers per trial.

    python examples/func_trainable.py --smoke-test
    python examples/func_trainable.py --num-workers 2 --address auto

``DistributedTrainableCreator(train_digits, num_workers=2)`` makes the Tune trainable;
``train_digits`` is ordinary PyTorch (DDP, a DistributedSampler, ``tune.report`` once an
epoch, ``distributed_checkpoint_dir`` for checkpoints). The code is the library's
``raysgd.torch.examples.func_trainable_example``.
"""
from raysgd.torch.examples.func_trainable_example import main

if __name__ == "__main__":
    main()
