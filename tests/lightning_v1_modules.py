"""Lightning 1.x modules, written the 1.x way, for tests/lightning_v1_driver.py (importable only
where pytorch_lightning 1.6-1.8 is installed: it uses the 1.x module path
``pytorch_lightning.core.lightning``, which 1.9 made a stub and 2.0 removed). Ray workers
import this file by name."""
import torch
from pytorch_lightning.core.lightning import LightningModule
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

TRUE_WEIGHTS = torch.tensor([[1.0], [-2.0], [0.5], [3.0]])


def regression(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ TRUE_WEIGHTS + 0.1)


def describe(outputs):
    """What an epoch-end hook received, in a form to compare (and send as JSON)."""
    first = outputs[0] if outputs else {}
    return {"count": len(outputs),
            "keys": sorted(first) if isinstance(first, dict) else type(first).__name__,
            "types": sorted({type(v).__name__ for o in outputs for v in o.values()}),
            "requires_grad": any(getattr(v, "requires_grad", False)
                                 for o in outputs for v in o.values())}


class V1Regressor(LightningModule):
    """Every 1.x-only hook and signature: training_step_end, training_epoch_end(outputs),
    validation_epoch_end(outputs), and the hooks that took optimizer_idx / dataloader_idx."""

    def __init__(self, config):
        super().__init__()
        torch.manual_seed(0)
        self.config = config
        self.net = nn.Linear(4, 1)
        self.calls = set()  # (hook, the 1.x-only arguments it got)
        self.epoch_ends = []  # (hook, describe(outputs)) per call

    def forward(self, x):
        return self.net(x)

    def setup(self, stage=None):
        self.data = regression()

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=32)

    def val_dataloader(self):
        return DataLoader(self.data, batch_size=64)

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.05)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5,
                                                             patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau,
                                                   "monitor": "val_mse_epoch"}}

    def training_step(self, batch, batch_idx):
        x, y = batch
        prediction = self(x)
        loss = F.mse_loss(prediction, y)
        self.log("train_mse", loss, on_step=True, on_epoch=True)  # forked: _step and _epoch
        return {"loss": loss, "abs_err": (prediction - y).abs().mean().detach()}

    def training_step_end(self, output):
        output["ended"] = torch.tensor(1.0)  # 1.x hands this dict on to training_epoch_end
        return output

    def training_epoch_end(self, outputs):
        self.epoch_ends.append(("training_epoch_end", describe(outputs)))
        self.log("epoch_mean_loss", torch.stack([o["loss"] for o in outputs]).mean())

    def validation_step(self, batch, batch_idx):
        x, y = batch
        mse = F.mse_loss(self(x), y)
        self.log("val_mse", mse, on_step=True)  # on_epoch by default here: forked
        return {"val_mse": mse, "count": torch.tensor(float(len(x)))}

    def validation_epoch_end(self, outputs):
        self.epoch_ends.append(("validation_epoch_end", describe(outputs)))
        self.log("val_samples", torch.stack([o["count"] for o in outputs]).sum())

    # ---- hooks whose 1.x signatures differ from 2.x's (Lightning 1.8's documented forms)
    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_idx, optimizer_closure,
                       on_tpu, using_native_amp, using_lbfgs):
        self.calls.add(("optimizer_step", optimizer_idx, on_tpu, using_native_amp, using_lbfgs))
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer, optimizer_idx):
        self.calls.add(("optimizer_zero_grad", optimizer_idx))
        optimizer.zero_grad()

    def on_before_optimizer_step(self, optimizer, optimizer_idx):
        self.calls.add(("on_before_optimizer_step", optimizer_idx))

    def lr_scheduler_step(self, scheduler, optimizer_idx, metric):
        self.calls.add(("lr_scheduler_step", optimizer_idx, metric is not None))
        scheduler.step(metric)

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx):
        self.calls.add(("on_validation_batch_end", dataloader_idx, sorted(outputs)[0]))

    def report(self):
        return {"calls": sorted(map(list, self.calls)), "epoch_ends": self.epoch_ends}
