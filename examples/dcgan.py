"""A DCGAN on scikit-learn's handwritten digits, with two models and two optimizers.

    python examples/dcgan.py --smoke-test
    python examples/dcgan.py --num-workers 2 --num-epochs 30 --fp16
    python examples/dcgan.py --address auto --use-gpu

The 1,797 8x8 digits (they ship with scikit-learn: no download) are scaled to
32x32 in [-1, 1]. The ready-made ``GANOperator`` alternates discriminator and
generator updates; with ``--fp16`` both go through the precision helpers.

Quality without Inception: a small classifier is trained on the real digits
here on the driver (98.6% validation accuracy), then judges 1,000
generated digits after every epoch:

- ``confidence``: its mean top-class probability (sharp, digit-like images
  score high; noise and blobs score low);
- ``digit score``: exp(E[KL(p(y|x) || p(y))]), the Inception-score formula
  with this classifier: 1 (all alike or unrecognisable) to 10 (confident and
  all ten digits equally often).

Both are printed for real validation digits and an untrained generator too,
as the scale to read the trained generator against.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ray
from digits_demo import DigitsNet, digits_datasets
from operators import GANOperator
from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

LATENT_DIM = 100


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


def data_creator(config):
    train, val = digits_datasets(seed=0)
    train_images = gan_images(train.tensors[0][:config.get("train_size")])
    val_images = gan_images(val.tensors[0])
    return (DataLoader(TensorDataset(train_images), batch_size=config[BATCH_SIZE], shuffle=True),
            DataLoader(TensorDataset(val_images), batch_size=config[BATCH_SIZE]))


# ------------------------------------------------------------ quality proxy
def train_judge(epochs: int = 15) -> nn.Module:
    """The digits classifier that judges generated images (in-process, seconds)."""
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
    print(f"judge: digits classifier, validation accuracy {accuracy:.3f}")
    return judge


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


def show(name: str, scores: dict) -> str:
    return f"{name}: confidence {scores['confidence']:.3f}, digit score {scores['digit_score']:.2f}"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-test", action="store_true", help="1 epoch on 256 digits")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    parser.add_argument("--num-epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch")
    parser.add_argument("--fp16", action="store_true",
                        help="mixed precision (fp16 + loss scaling on GPU, bf16 on CPU)")
    parser.add_argument("--samples", type=int, default=1000, help="generated digits judged")
    parser.add_argument("--tqdm", action="store_true", help="a progress bar per call")
    return parser.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    train_size = 256 if args.smoke_test else None
    epochs = 1 if args.smoke_test else args.num_epochs
    judge = train_judge(epochs=3 if args.smoke_test else 15)
    real = gan_images(digits_datasets(seed=0)[1].tensors[0])
    torch.manual_seed(0)
    print(show("real validation digits", quality(judge, real)))
    print(show("untrained generator", quality(judge, generate(Generator(), args.samples))))

    ray.init(address=args.address, num_cpus=None if args.address else max(args.num_workers, 2))
    trainer = TorchTrainer(
        training_operator_cls=DigitsGAN, num_workers=args.num_workers, use_gpu=args.use_gpu,
        use_fp16=args.fp16, use_tqdm="always" if args.tqdm else False,
        config={"discriminator_creator": lambda config: Discriminator(),
                "generator_creator": lambda config: Generator(), "data_creator": data_creator,
                "latent_dim": LATENT_DIM, "lr": 2e-4, BATCH_SIZE: args.batch_size,
                "train_size": train_size})
    for _ in range(epochs):
        stats = trainer.train()
        _, generator = trainer.get_model(to_cpu=True)
        scores = quality(judge, generate(generator, args.samples))
        print(f"epoch {stats['epoch']}: loss_d {stats['loss_d']:.3f}, loss_g {stats['loss_g']:.3f}, "
              f"d_real {stats['d_real']:.3f}, d_fake {stats['d_fake']:.3f}; "
              + show("generated", scores), flush=True)
    trainer.shutdown()
    print(show("generated digits after training", scores))
    return scores


if __name__ == "__main__":
    main()
