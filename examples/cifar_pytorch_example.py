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
"""
from __future__ import annotations

import argparse
import os

import torch
from filelock import FileLock
from torch.utils.data import DataLoader, TensorDataset

import ray
from operators import ClassificationOperator
from raysgd import TorchTrainer
from raysgd.torch.resnet import ResNet18
from raysgd.utils import BATCH_SIZE

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def real_cifar_available(data_dir: str) -> bool:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return os.path.isdir(os.path.join(data_dir, "cifar-10-batches-py"))


def cifar10(data_dir: str, download: bool):
    import torchvision.transforms as T
    from torchvision.datasets import CIFAR10

    normalize = T.Normalize(CIFAR_MEAN, CIFAR_STD)
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                          normalize])
    os.makedirs(data_dir, exist_ok=True)
    with FileLock(os.path.join(data_dir, ".raysgd.lock")):
        train = CIFAR10(data_dir, train=True, download=download, transform=train_tf)
        val = CIFAR10(data_dir, train=False, download=download,
                      transform=T.Compose([T.ToTensor(), normalize]))
    return train, val


def synthetic_cifar(train_size: int, val_size: int, seed: int = 0):
    """CIFAR-shaped data a network can learn: a smooth random pattern per class, plus noise."""
    generator = torch.Generator().manual_seed(seed)
    templates = torch.nn.functional.interpolate(
        torch.randn(10, 3, 4, 4, generator=generator), size=32, mode="bilinear",
        align_corners=False)

    def make(count):
        labels = torch.randint(0, 10, (count,), generator=generator)
        noise = torch.randn(count, 3, 32, 32, generator=generator)
        return TensorDataset(templates[labels] + 1.5 * noise, labels)

    return make(train_size), make(val_size)


def data_creator(config):
    if config["data"] == "cifar10":
        train, val = cifar10(config["data_dir"], config["download"])
    else:
        train, val = synthetic_cifar(config["train_size"], config["val_size"])
    return (DataLoader(train, batch_size=config[BATCH_SIZE], shuffle=True),
            DataLoader(val, batch_size=config[BATCH_SIZE]))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-test", action="store_true",
                        help="1 epoch on 64 synthetic images (seconds)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    parser.add_argument("--num-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--fp16", action="store_true",
                        help="mixed precision (fp16 + loss scaling on GPU, bf16 on CPU)")
    parser.add_argument("--data-dir", default=os.path.expanduser("~/data"))
    parser.add_argument("--download", action="store_true", help="fetch CIFAR-10 (torchvision)")
    parser.add_argument("--train-size", type=int, default=5000, help="synthetic data only")
    parser.add_argument("--val-size", type=int, default=1000, help="synthetic data only")
    parser.add_argument("--tqdm", action="store_true", help="a progress bar per call")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    real = not args.smoke_test and (args.download or real_cifar_available(args.data_dir))
    if args.smoke_test:
        args.num_epochs, args.train_size, args.val_size, args.batch_size = 1, 64, 32, 32
    data = "cifar10" if real else "synthetic"
    if not real:
        print(f"data: SYNTHETIC CIFAR-shaped images ({args.train_size} train, {args.val_size} "
              f"validation), not CIFAR-10: torchvision or {args.data_dir}/cifar-10-batches-py "
              "is missing (pass --download to fetch it)")
    ray.init(address=args.address, num_cpus=None if args.address else max(args.num_workers, 2))
    trainer = TorchTrainer(
        training_operator_cls=ClassificationOperator, num_workers=args.num_workers,
        use_gpu=args.use_gpu, use_fp16=args.fp16, use_tqdm="always" if args.tqdm else False,
        config={"model_creator": ResNet18, "data_creator": data_creator, "lr": args.lr,
                "momentum": 0.9, BATCH_SIZE: args.batch_size, "data": data,
                "data_dir": args.data_dir, "download": args.download,
                "train_size": args.train_size, "val_size": args.val_size})
    for _ in range(args.num_epochs):
        train = trainer.train()
        val = trainer.validate()
        print(f"[{data}] epoch {train['epoch']}: train_loss {train['train_loss']:.4f}, "
              f"val_loss {val['val_loss']:.4f}, val_accuracy {val['val_accuracy']:.4f}, "
              f"val_top5_accuracy {val['val_top5_accuracy']:.4f}")
    trainer.shutdown()


if __name__ == "__main__":
    main()
