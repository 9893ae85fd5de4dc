"""ResNet-18 on CIFAR-10 with the ready-made ClassificationOperator.

    python examples/cifar_pytorch_example.py --smoke-test
    python examples/cifar_pytorch_example.py --num-workers 2 --num-epochs 5 --fp16 --tqdm
    python examples/cifar_pytorch_example.py --address auto --use-gpu --num-workers 8

Real CIFAR-10 is used when torchvision is installed and the data set is in
``--data-dir`` (or ``--download`` is given; downloads run under a file lock,
so workers sharing a disk fetch it once). Otherwise the script says so and
trains on SYNTHETIC CIFAR-shaped data: 3x32x32 images made of one smooth
random pattern per class plus noise, learnable but not CIFAR. Every result
line names the data it came from.

The code is the library's ``raysgd.torch.examples.cifar_pytorch_example`` (the
legacy import path), whose ``train_cifar(test_mode, num_workers, use_gpu,
num_epochs, fp16)`` is legacy's entry point.
"""
from raysgd.torch.examples.cifar_pytorch_example import main

if __name__ == "__main__":
    main()
