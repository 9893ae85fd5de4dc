"""A DCGAN with two models and two optimizers (``ray.util.sgd.torch.examples.dcgan``).

    python examples/dcgan.py --smoke-test
    python examples/dcgan.py --num-workers 2 --num-epochs 30 --fp16
    python examples/dcgan.py --address auto --use-gpu

Legacy RaySGD trained this on MNIST, downloaded, and scored it with a
downloaded MNIST classifier. Here the data are scikit-learn's 1,797 8x8
handwritten digits (they ship with scikit-learn: no download), scaled to 32x32
in [-1, 1]. The ready-made ``GANOperator`` alternates discriminator and
generator updates; with ``fp16`` both go through the precision helpers.

Quality without Inception: a small classifier is trained on the real digits
(98.6% validation accuracy), then judges generated digits after every epoch:

- ``confidence``: its mean top-class probability (sharp, digit-like images
  score high; noise and blobs score low);
- ``digit score``: exp(E[KL(p(y|x) || p(y))]), the Inception-score formula
  with this classifier: 1 (all alike or unrecognisable) to 10 (confident and
  all ten digits equally often).

The command line prints both for real validation digits and an untrained
generator too, as the scale to read the trained generator against.
"""
from __future__ import annotations

import argparse
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from operators import GANOperator
from raysgd import TorchTrainer
from raysgd.torch.examples._cluster import add_cluster_flags, init_ray, on_cluster
from raysgd.torch.examples.digits import DigitsNet, digits_datasets
from raysgd.utils import BATCH_SIZE

LATENT_DIM = 100
TEST_MODE_IMAGES = 64  # test_mode trains on this many digits, as legacy's MNIST subset


def gan_images(images: torch.Tensor) -> torch.Tensor:
    """Digits in [0, 1] at 8x8 -> the GAN's 32x32 in [-1, 1]."""
    return F.interpolate(images, size=32, mode="bilinear", align_corners=False) * 2 - 1


def classifier_view(images: torch.Tensor) -> torch.Tensor:
    """The GAN's 32x32 in [-1, 1] -> the classifier's 8x8 in [0, 1]."""
    return F.adaptive_avg_pool2d((images.clamp(-1, 1) + 1) / 2, 8)


class Generator(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()

        def up(cin, cout, stride, padding):
            return [nn.ConvTranspose2d(cin, cout, 4, stride, padding, bias=False),
                    nn.BatchNorm2d(cout), nn.ReLU(True)]

        self.net = nn.Sequential(*up(LATENT_DIM, width * 4, 1, 0), *up(width * 4, width * 2, 2, 1),
                                 *up(width * 2, width, 2, 1),
                                 nn.ConvTranspose2d(width, 1, 4, 2, 1), nn.Tanh())

    def forward(self, noise):
        return self.net(noise.view(noise.size(0), LATENT_DIM, 1, 1))


class Discriminator(nn.Module):
    """Outputs one logit per image (train with ``BCEWithLogitsLoss``)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, width, 4, 2, 1), nn.LeakyReLU(0.2, True),
            nn.Conv2d(width, width * 2, 4, 2, 1), nn.LeakyReLU(0.2, True),
            nn.Conv2d(width * 2, width * 4, 4, 2, 1), nn.LeakyReLU(0.2, True),
            nn.Conv2d(width * 4, 1, 4, 1, 0), nn.Flatten())

    def forward(self, images):
        return self.net(images)


class DigitsGAN(GANOperator):
    """The ready-made GAN, seeded per rank so a run repeats and each worker draws its own noise."""

    def setup(self, config):
        torch.manual_seed(config.get("seed", 0) + self.world_rank)
        super().setup(config)


def discriminator_creator(config):
    return Discriminator()


def generator_creator(config):
    return Generator()


def data_creator(config):
    """Runs on each worker: the first ``config["train_size"]`` training digits (all when None)."""
    train, val = digits_datasets(seed=0)
    train_images = gan_images(train.tensors[0][:config.get("train_size")])
    val_images = gan_images(val.tensors[0])
    return (DataLoader(TensorDataset(train_images), batch_size=config[BATCH_SIZE], shuffle=True),
            DataLoader(TensorDataset(val_images), batch_size=config[BATCH_SIZE]))


# ------------------------------------------------------------ quality proxy
def train_judge(epochs: int = 15):
    """The digits classifier that judges generated images (seconds); returns
    ``(judge, validation accuracy)``."""
    torch.manual_seed(0)
    train, val = digits_datasets(seed=0)
    judge = DigitsNet()
    optimizer = torch.optim.Adam(judge.parameters(), lr=3e-3)
    for _ in range(epochs):
        for images, labels in DataLoader(train, batch_size=64, shuffle=True):
            optimizer.zero_grad()
            F.cross_entropy(judge(images), labels).backward()
            optimizer.step()
    judge.eval()
    images, labels = val.tensors
    with torch.no_grad():
        accuracy = (judge(images).argmax(1) == labels).float().mean().item()
    return judge, accuracy


@torch.no_grad()
def quality(judge: nn.Module, images: torch.Tensor) -> dict:
    """Confidence and digit score of 32x32 images in [-1, 1]."""
    probs = F.softmax(judge(classifier_view(images)), dim=1)
    marginal = probs.mean(0, keepdim=True)
    kl = (probs * (probs.clamp_min(1e-12).log() - marginal.clamp_min(1e-12).log())).sum(1)
    return {"confidence": probs.max(1).values.mean().item(), "digit_score": kl.mean().exp().item()}


@torch.no_grad()
def generate(generator: nn.Module, count: int, seed: int = 1) -> torch.Tensor:
    generator = generator.cpu().eval()
    noise = torch.randn(count, LATENT_DIM, generator=torch.Generator().manual_seed(seed))
    return generator(noise)


def judge_with_references(epochs: int, samples: int):
    """A trained judge, its accuracy, and its scores for real validation digits and for an
    untrained generator (the scale the trained generator is read against)."""
    judge, accuracy = train_judge(epochs)
    real = quality(judge, gan_images(digits_datasets(seed=0)[1].tensors[0]))
    torch.manual_seed(0)
    return judge, accuracy, real, quality(judge, generate(Generator(), samples))


def show(name: str, scores: dict) -> str:
    return f"{name}: confidence {scores['confidence']:.3f}, digit score {scores['digit_score']:.2f}"


# ------------------------------------------------------------ training
def train_example(num_workers: int = 1, use_gpu: bool = False, test_mode: bool = False,
                  data_dir: str = "~/data/", *, num_epochs: int = 5,
                  batch_size: Optional[int] = None, fp16=False, samples: Optional[int] = None,
                  judge: Optional[nn.Module] = None, use_tqdm=False) -> TorchTrainer:
    """Train the DCGAN for ``num_epochs`` epochs (5, as legacy) and return the trainer, still
    running: the caller takes ``trainer.get_model()`` (discriminator, generator) and calls
    ``trainer.shutdown()``.

    ``test_mode`` trains on 64 digits in batches of 16 and judges 256 samples (seconds).
    ``data_dir`` is accepted for legacy callers (it held MNIST); the digits need no
    directory. After every epoch the generator's samples are judged by ``judge`` (trained
    here when not given; on the cluster when the driver is a Ray Client) and printed.
    """
    del data_dir  # the digits ship with scikit-learn
    samples = samples or (256 if test_mode else 1000)
    if judge is None:
        judge, _ = on_cluster(train_judge, 3 if test_mode else 15)
    if batch_size is None:
        batch_size = 16 * num_workers if test_mode else 64
    trainer = TorchTrainer(
        training_operator_cls=DigitsGAN, num_workers=num_workers, use_gpu=use_gpu,
        use_fp16=fp16, use_tqdm=use_tqdm,
        config={"discriminator_creator": discriminator_creator,
                "generator_creator": generator_creator, "data_creator": data_creator,
                "latent_dim": LATENT_DIM, "lr": 2e-4, BATCH_SIZE: batch_size,
                "train_size": TEST_MODE_IMAGES if test_mode else None})
    for epoch in range(num_epochs):
        stats = trainer.train(info={"epoch_idx": epoch, "num_epochs": num_epochs})
        _, generator = trainer.get_model(to_cpu=True)  # a Ray Client driver may have no GPU
        scores = quality(judge, generate(generator, samples))
        print(f"epoch {stats['epoch']}: loss_d {stats['loss_d']:.3f}, "
              f"loss_g {stats['loss_g']:.3f}, "
              f"d_real {stats['d_real']:.3f}, d_fake {stats['d_fake']:.3f}; "
              + show("generated", scores), flush=True)
    return trainer


def main(argv=None) -> dict:
    """``python examples/dcgan.py [--smoke-test] [--num-workers N] [--num-epochs E]
    [--batch-size B] [--fp16] [--samples S] [--tqdm] [--use-gpu]
    [--address auto | --server-address HOST:PORT]``"""
    parser = argparse.ArgumentParser(description="A DCGAN on scikit-learn's handwritten digits.")
    parser.add_argument("--smoke-test", action="store_true",
                        help="test mode: 1 epoch on 64 digits")
    add_cluster_flags(parser, num_workers=2)
    parser.add_argument("--data-dir", default="~/data/", help="accepted for legacy scripts; unused")
    parser.add_argument("--num-epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="global batch (default 64; 16 per worker with --smoke-test)")
    parser.add_argument("--fp16", action="store_true",
                        help="mixed precision (fp16 + loss scaling on GPU, bf16 on CPU)")
    parser.add_argument("--samples", type=int, default=1000, help="generated digits judged")
    parser.add_argument("--tqdm", action="store_true", help="a progress bar per call")
    args = parser.parse_args(argv)
    init_ray(args, num_cpus=max(args.num_workers, 2))
    judge, accuracy, real, untrained = on_cluster(
        judge_with_references, 3 if args.smoke_test else 15, args.samples)
    print(f"judge: digits classifier, validation accuracy {accuracy:.3f}")
    print(show("real validation digits", real))
    print(show("untrained generator", untrained))
    trainer = train_example(
        num_workers=args.num_workers, use_gpu=args.use_gpu, test_mode=args.smoke_test,
        data_dir=args.data_dir, num_epochs=1 if args.smoke_test else args.num_epochs,
        batch_size=args.batch_size, fp16=args.fp16, samples=args.samples, judge=judge,
        use_tqdm="always" if args.tqdm else False)
    _, generator = trainer.get_model(to_cpu=True)
    trainer.shutdown()
    scores = quality(judge, generate(generator, args.samples))
    print(show("generated digits after training", scores))
    return scores


if __name__ == "__main__":
    main()
