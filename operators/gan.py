"""A GAN: alternating discriminator and generator updates, correct in every precision."""
from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn

from raysgd import TrainingOperator
from raysgd.utils import NUM_SAMPLES, move_to_device

from operators import _config


class GANOperator(TrainingOperator):
    """Two models, two optimizers, a non-saturating GAN loss on logits.

    ``config`` keys: ``discriminator_creator(config)`` (outputs one logit per sample),
    ``generator_creator(config)`` (maps ``latent_dim`` noise to samples), ``data_creator(config)
    -> (train_loader, validation_loader or None)`` of real samples, or ``(samples, label)``
    pairs whose label is ignored (required); ``latent_dim`` (default 100), ``lr`` (2e-4),
    ``betas`` ((0.5, 0.999)), ``clip_grad_norm`` (None: no clipping).

    Each batch updates the discriminator on real and generated samples, then the
    generator. Metrics: ``loss_d``, ``loss_g``, and the discriminator's mean
    probability for real (``d_real``) and generated (``d_fake``) samples.
    """

    def setup(self, config: Dict[str, Any]) -> None:
        discriminator = _config.creator(config, "discriminator_creator", "nn.Module")(config)
        generator = _config.creator(config, "generator_creator", "nn.Module")(config)
        adam = dict(lr=config.get("lr", 2e-4), betas=tuple(config.get("betas", (0.5, 0.999))))
        self.models, self.optimizers, self.criterion = self.register(
            models=(discriminator, generator),
            optimizers=(torch.optim.Adam(discriminator.parameters(), **adam),
                        torch.optim.Adam(generator.parameters(), **adam)),
            criterion=nn.BCEWithLogitsLoss())
        train_loader, val_loader = _config.loaders(config)
        self.register_data(train_loader=train_loader, validation_loader=val_loader)
        self.latent_dim = config.get("latent_dim", 100)
        self.max_norm = config.get("clip_grad_norm")

    def noise(self, count: int) -> torch.Tensor:
        return torch.randn(count, self.latent_dim, device=self.device)

    def train_batch(self, batch: Any, batch_info: dict) -> dict:
        real = self._real(batch)
        discriminator, generator = self.models
        opt_d, opt_g = self.optimizers
        ones = torch.ones(real.size(0), 1, device=self.device)
        with self.autocast():
            fake = generator(self.noise(real.size(0)))
            real_logits, fake_logits = discriminator(real), discriminator(fake.detach())
            loss_d = self.criterion(real_logits, ones) + self.criterion(fake_logits, 1 - ones)
        self._update(opt_d, discriminator, loss_d)
        with self.autocast():
            loss_g = self.criterion(discriminator(fake), ones)
        self._update(opt_g, generator, loss_g)
        return {"loss_d": loss_d.item(), "loss_g": loss_g.item(),
                "d_real": torch.sigmoid(real_logits.float()).mean().item(),
                "d_fake": torch.sigmoid(fake_logits.float()).mean().item(),
                NUM_SAMPLES: real.size(0)}

    def validate_batch(self, batch: Any, batch_info: dict) -> dict:
        real = self._real(batch)
        discriminator, generator = self.models
        with self.autocast():
            real_p = torch.sigmoid(discriminator(real).float()).mean()
            fake_p = torch.sigmoid(discriminator(generator(self.noise(real.size(0)))).float()).mean()
        return {"val_d_real": real_p.item(), "val_d_fake": fake_p.item(), NUM_SAMPLES: real.size(0)}

    def _real(self, batch: Any) -> torch.Tensor:
        batch = move_to_device(batch, self.device)
        return batch[0] if isinstance(batch, (list, tuple)) else batch

    def _update(self, optimizer, model, loss) -> None:
        optimizer.zero_grad(set_to_none=True)
        self.backward(loss)
        if self.max_norm:
            self.clip_grad_norm_(model, self.max_norm)
        self.step(optimizer)
