"""A DCGAN on scikit-learn's handwritten digits, with two models and two optimizers.

    python examples/dcgan.py --smoke-test
    python examples/dcgan.py --num-workers 2 --num-epochs 30 --fp16
    python examples/dcgan.py --address auto --use-gpu

The 1,797 8x8 digits (they ship with scikit-learn: no download) are scaled to
32x32 in [-1, 1]; the ready-made ``GANOperator`` alternates discriminator and
generator updates. A small digits classifier (98.6% validation accuracy)
judges 1,000 generated digits after every epoch: its mean top-class
probability (``confidence``) and the Inception-score formula with it
(``digit score``, 1 to 10), printed for real digits and an untrained
generator too, as the scale to read the trained generator against.

The code is the library's ``raysgd.torch.examples.dcgan`` (the legacy import
path), whose ``train_example(num_workers, use_gpu, test_mode, data_dir)``
returns the running trainer as legacy's did.
"""
from raysgd.torch.examples.dcgan import main

if __name__ == "__main__":
    main()
