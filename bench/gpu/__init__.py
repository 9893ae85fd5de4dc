"""GPU precision benchmark: ResNet-50 throughput in fp32, fp16 and bf16.

``python -m bench.gpu [--quick] [--out PATH]`` (or ``python -m bench --gpu``)
runs, each as its own subprocess with repetitions in rotating order:

* ``raysgd_<precision>``: raysgd ``TorchTrainer(num_workers=1, use_local=True,
  use_fp16=...)`` with the default ``train_batch`` (raysgd's precision object
  does the autocast and loss scaling);
* ``raysgd_lightning_<precision>``: the same trainer with a LightningModule
  (``TrainingOperator.from_ptl``) that logs its loss each step;
* ``loop_<precision>``: a hand-written loop in one process with
  ``torch.autocast`` (+ ``torch.amp.GradScaler`` for fp16).

Both train on a small pool of synthetic batches created once on the device,
so the figures measure the training step, not data loading. See
``bench/README.md`` ("GPU precision benchmark").

This module imports nothing heavy: the parent and the loop variant must not
pay for raysgd or Ray.
"""

PRECISIONS = ("fp32", "fp16", "bf16")

# What each precision passes to TorchTrainer(use_fp16=...). "fp16" rather than
# True: True means bf16 on CPU, so a CPU smoke run would not exercise the scaler.
RAYSGD_USE_FP16 = {"fp32": False, "fp16": "fp16", "bf16": "bf16"}

NEEDS_CUDA = "the GPU mode needs CUDA; use --quick for a CPU smoke run"
