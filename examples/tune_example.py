"""Grid search over the learning rate with Ray Tune, as in the legacy RaySGD guide.

    python examples/tune_example.py --smoke-test
    python examples/tune_example.py --num-workers 2 --address auto
    python examples/tune_example.py --lr-reduce-on-plateau      # a custom Tune step

Each trial runs a 2-worker (by default) ``TorchTrainer`` on the linear data
set; ``step()`` is one ``train()`` plus one ``validate()``, with metrics
averaged over the workers. The best learning rate is printed at the end. The
code is the library's ``raysgd.torch.examples.tune_example`` (the legacy import
path), which also provides the legacy ``tune_example``, ``tune_example_manual``
and ``get_custom_training_operator``.
"""
from raysgd.torch.examples.tune_example import main

if __name__ == "__main__":
    main()
