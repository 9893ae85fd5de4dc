"""ResNet-18 on CIFAR-10 with the ready-made ClassificationOperator
(``ray.util.sgd.torch.examples.cifar_pytorch_example``).

    python examples/cifar_pytorch_example.py --smoke-test
    python examples/cifar_pytorch_example.py --num-workers 2 --num-epochs 5 --fp16 --tqdm
    python examples/cifar_pytorch_example.py --address auto --use-gpu --num-workers 8

Real CIFAR-10 is used when torchvision is installed and the data set is in
``data_dir`` (default ``~/data``, on the machines the workers run on), or
``download`` is asked for (downloads run under a file lock, so workers sharing
a disk fetch it once). Otherwise it says so and trains on SYNTHETIC
CIFAR-shaped data: 3x32x32 images made of one smooth random pattern per class
plus noise, learnable but not CIFAR. Every result line names the data it came
from.
"""
from __future__ import annotations

import argparse
import os
from typing import Any, Dict, Optional

import torch
from filelock import FileLock
from torch.utils.data import DataLoader, Subset, TensorDataset

from operators import ClassificationOperator
from raysgd import TorchTrainer
from raysgd.torch.examples._cluster import add_cluster_flags, init_ray, on_cluster, require
from raysgd.torch.resnet import ResNet18
from raysgd.utils import BATCH_SIZE

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
TEST_MODE_SIZE = (64, 32)  # test_mode's train and validation sizes (legacy: 64-image subsets)


def real_cifar_available(data_dir: str) -> bool:
    """Whether torchvision is importable and CIFAR-10 is in ``data_dir`` on this machine."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return os.path.isdir(os.path.join(os.path.expanduser(data_dir), "cifar-10-batches-py"))


def cifar10(data_dir: str, download: bool):
    """The CIFAR-10 train and test sets from ``data_dir``, normalised, train augmented."""
    require("torchvision", "torchvision", "Real CIFAR-10")
    import torchvision.transforms as T
    from torchvision.datasets import CIFAR10

    normalize = T.Normalize(CIFAR_MEAN, CIFAR_STD)
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(),
                          normalize])
    data_dir = os.path.expanduser(data_dir)  # here, on the worker: its home, not the driver's
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
    """Runs on each worker: real CIFAR-10 (a subset when ``config["subset"]``) or synthetic."""
    if config["data"] == "cifar10":
        train, val = cifar10(config["data_dir"], config["download"])
        if config.get("subset"):
            train, val = (Subset(train, range(config["train_size"])),
                          Subset(val, range(config["val_size"])))
    else:
        train, val = synthetic_cifar(config["train_size"], config["val_size"])
    return (DataLoader(train, batch_size=config[BATCH_SIZE], shuffle=True),
            DataLoader(val, batch_size=config[BATCH_SIZE]))


def _require_torchvision() -> None:
    require("torchvision", "torchvision", "Downloading CIFAR-10")


def choose_data(data_dir: str, download: bool) -> str:
    """``"cifar10"`` or ``"synthetic"``, decided where the workers run (a Ray Client driver's
    disk is not theirs); ``download`` without torchvision there raises an ImportError."""
    if download:
        on_cluster(_require_torchvision)
        return "cifar10"
    return "cifar10" if on_cluster(real_cifar_available, data_dir) else "synthetic"


def train_cifar(test_mode: bool = False, num_workers: int = 1, use_gpu: bool = False,
                num_epochs: int = 5, fp16=False, *, data_dir: str = "~/data",
                download: bool = False, batch_size: Optional[int] = None, lr: float = 0.1,
                train_size: int = 5000, val_size: int = 1000, use_tqdm=False) -> Dict[str, Any]:
    """Train ResNet-18 for ``num_epochs`` epochs, printing train and validation metrics each
    epoch; returns the final validation metrics, with ``"data"`` naming the data set.

    ``test_mode``: 64 training and 32 validation images (a subset of real CIFAR-10 when
    present), batches of 32 (seconds per epoch). ``batch_size`` is the global batch
    (default ``128 * num_workers``, as legacy); ``train_size``/``val_size`` size the
    synthetic data. ``fp16`` on a CPU trains in bf16 (with a warning).
    """
    data = choose_data(data_dir, download)
    subset = test_mode and data == "cifar10"
    if test_mode:
        (train_size, val_size), batch_size = TEST_MODE_SIZE, batch_size or 32
    batch_size = batch_size or 128 * num_workers
    if data == "synthetic":
        print(f"data: SYNTHETIC CIFAR-shaped images ({train_size} train, {val_size} validation), "
              f"not CIFAR-10: torchvision or {data_dir}/cifar-10-batches-py is missing "
              "(pass --download to fetch it)")
    else:
        print(f"data: CIFAR-10 from {data_dir}" + (f" ({train_size}/{val_size}-image subsets)"
                                                    if subset else ""))
    trainer = TorchTrainer(
        training_operator_cls=ClassificationOperator, num_workers=num_workers, use_gpu=use_gpu,
        use_fp16=fp16, use_tqdm=use_tqdm,
        config={"model_creator": ResNet18, "data_creator": data_creator, "lr": lr,
                "momentum": 0.9, BATCH_SIZE: batch_size, "data": data, "data_dir": data_dir,
                "download": download, "subset": subset, "train_size": train_size,
                "val_size": val_size})
    try:
        for epoch in range(num_epochs):
            train = trainer.train(info={"epoch_idx": epoch, "num_epochs": num_epochs})
            val = trainer.validate()
            print(f"[{data}] epoch {train['epoch']}: train_loss {train['train_loss']:.4f}, "
                  f"val_loss {val['val_loss']:.4f}, val_accuracy {val['val_accuracy']:.4f}, "
                  f"val_top5_accuracy {val['val_top5_accuracy']:.4f}", flush=True)
        final = trainer.validate()
    finally:
        trainer.shutdown()
    print(f"[{data}] final validation: {final}")
    return {**final, "data": data}


def main(argv=None) -> Dict[str, Any]:
    """``python examples/cifar_pytorch_example.py [--smoke-test] [--num-workers N]
    [--num-epochs E] [--batch-size B] [--lr LR] [--fp16] [--data-dir D] [--download]
    [--train-size N] [--val-size N] [--tqdm] [--use-gpu]
    [--address auto | --server-address HOST:PORT]``"""
    parser = argparse.ArgumentParser(
        description="ResNet-18 on CIFAR-10 (or labelled synthetic data).")
    parser.add_argument("--smoke-test", action="store_true",
                        help="test mode: 1 epoch on 64 images (seconds)")
    add_cluster_flags(parser, num_workers=2)
    parser.add_argument("--num-epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--fp16", action="store_true",
                        help="mixed precision (fp16 + loss scaling on GPU, bf16 on CPU)")
    parser.add_argument("--data-dir", default="~/data",
                        help="where CIFAR-10 is (or goes), on the workers' machines")
    parser.add_argument("--download", action="store_true", help="fetch CIFAR-10 (torchvision)")
    parser.add_argument("--train-size", type=int, default=5000, help="synthetic data only")
    parser.add_argument("--val-size", type=int, default=1000, help="synthetic data only")
    parser.add_argument("--tqdm", action="store_true", help="a progress bar per call")
    args = parser.parse_args(argv)
    init_ray(args, num_cpus=max(args.num_workers, 2))
    return train_cifar(
        test_mode=args.smoke_test, num_workers=args.num_workers, use_gpu=args.use_gpu,
        num_epochs=1 if args.smoke_test else args.num_epochs, fp16=args.fp16,
        data_dir=args.data_dir, download=args.download,
        batch_size=None if args.smoke_test else args.batch_size, lr=args.lr,
        train_size=args.train_size, val_size=args.val_size,
        use_tqdm="always" if args.tqdm else False)


if __name__ == "__main__":
    main()
