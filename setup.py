from setuptools import find_packages, setup

DOCS = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5", "mkdocstrings-python>=1.10"]

setup(
    name="raysgd",
    version="0.1.0",
    description="The RaySGD operator API (TorchTrainer + TrainingOperator) on Ray 2.x and PyTorch 2.x",
    packages=find_packages(include=["raysgd", "raysgd.*", "operators", "operators.*"]),
    python_requires=">=3.9",
    install_requires=[
        # A range 2.13 satisfies; install torch first (see Makefile) to keep it CPU-sized.
        "torch>=2.1,<3",
        "ray[tune]>=2.9",
        "filelock",
        "pyarrow>=9",  # checkpoint_dir on S3, GCS, ... (pyarrow.fs, as Ray Train)
        "tabulate",
        "tqdm",
        "numpy",
    ],
    extras_require={
        "tune": ["ray[tune]>=2.9"],
        "demo": ["scikit-learn", "matplotlib"],
        # Lightning 2.x for TrainingOperator.from_ptl; raysgd imports it only when asked.
        "lightning": ["pytorch_lightning>=2.0,<3"],
        # Experiment tracking and curves (raysgd.loggers, python -m raysgd.plot); each is
        # imported only when its logger or the plot command is used.
        "tensorboard": ["tensorboard"],
        "mlflow": ["mlflow-skinny"],
        "wandb": ["wandb"],
        "plot": ["matplotlib"],
        # The documentation site (`make docs`; `make test` builds it strictly).
        "docs": DOCS,
        "test": ["pytest", "pytest-timeout", "hypothesis", "scikit-learn", "ray[train,client]>=2.9",
                 "moto[server]", "pytorch_lightning>=2.0,<3", "tensorboard", "mlflow-skinny", "wandb",
                 "matplotlib", "torchft==0.2.0", *DOCS],
    },
)
