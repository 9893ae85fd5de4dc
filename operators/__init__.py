"""Ready-made operators built only on the public raysgd API; configure them through ``config``.

- :class:`ClassificationOperator`: cross-entropy, accuracy and top-k validation.
- :class:`RegressionOperator`: MSE/Huber/L1, MSE and MAE validation.
- :class:`GANOperator`: alternating discriminator/generator updates with the precision helpers.
"""
from operators.classification import ClassificationOperator
from operators.gan import GANOperator
from operators.regression import RegressionOperator

__all__ = ["ClassificationOperator", "GANOperator", "RegressionOperator"]
