"""Experiment tracking for TorchTrainer: CSV, TensorBoard, MLflow and W&B.

Pass instances as ``TorchTrainer(loggers=[...])``; subclass :class:`Logger` for
another tracker. The tracker packages are imported only when a logger is set
up, so importing this package costs nothing.
"""
from raysgd.loggers.base import Logger, flatten_config
from raysgd.loggers.csv_logger import CSVLogger
from raysgd.loggers.hub import LoggerHub
from raysgd.loggers.mlflow_logger import MLflowLogger
from raysgd.loggers.tensorboard import TensorBoardLogger
from raysgd.loggers.wandb_logger import WandbLogger

__all__ = ["Logger", "CSVLogger", "TensorBoardLogger", "MLflowLogger", "WandbLogger",
           "LoggerHub", "flatten_config"]
