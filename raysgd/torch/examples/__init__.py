"""Legacy ``ray.util.sgd.torch.examples`` modules, runnable offline.

- ``train_example``: the linear example (``LinearDataset``, the creators, ``train_example``);
- ``tune_example``: ``tune_example``, ``tune_example_manual``, ``get_custom_training_operator``;
- ``dcgan``: ``train_example`` (a DCGAN on scikit-learn's digits instead of MNIST);
- ``cifar_pytorch_example``: ``train_cifar`` (ResNet-18; labelled synthetic data without CIFAR-10).

``examples/*.py`` in the repository are thin command-line wrappers around these.
"""
