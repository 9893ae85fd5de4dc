"""``LightningModule`` training on raysgd (Lightning 2.x, or 1.6-1.9): ``TrainingOperator.from_ptl(...)``.

Needs ``pytorch_lightning`` or ``lightning`` (``pip install raysgd[lightning]``);
``import raysgd`` never imports this package.
"""
from raysgd.lightning.compat import require_lightning

require_lightning()

from raysgd.lightning.factory import make_lightning_operator  # noqa: E402
from raysgd.lightning.operator import LightningOperator  # noqa: E402

__all__ = ["LightningOperator", "make_lightning_operator"]
