"""CUDA fp16 with GradScaler and NCCL; skipped where there is no GPU (CI has none)."""
import pytest
import torch

from operators_for_tests import LinearOperator, PrecisionGANOperator
from raysgd import TorchTrainer
from raysgd.utils import BATCH_SIZE

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_fp16_one_gpu_worker_scales_and_learns(ray_session):
    trainer = TorchTrainer(training_operator_cls=LinearOperator, num_workers=1, use_gpu=True,
                           use_fp16=True, backend="nccl", config={BATCH_SIZE: 50})
    try:
        kind = trainer.apply_all_operators(
            lambda op: (type(op._context.precision).__name__, op.device.type))
        assert kind == [("ScaledFp16Precision", "cuda")]
        losses = [trainer.train()["train_loss"] for _ in range(6)]
        assert losses[-1] < 0.5 * losses[0]

        def overflow(op):
            prec = op._context.precision
            before = prec.state_dict()["scaler"]["scale"]
            op.optimizer.zero_grad()
            x = torch.ones(4, 1, device=op.device)
            with op.autocast():
                loss = op.criterion(op.model(x), x) * float("inf")
            op.backward(loss)
            skipped = not op.step(op.optimizer)
            return skipped, before, prec.state_dict()["scaler"]["scale"]

        skipped, before, after = trainer.apply_all_operators(overflow)[0]
        assert skipped and after == before * 0.5
    finally:
        trainer.shutdown()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_fp16_gan_on_two_gpus_with_nccl(ray_session):
    trainer = TorchTrainer(training_operator_cls=PrecisionGANOperator, num_workers=2,
                           use_gpu=True, use_fp16=True, backend="nccl", config={BATCH_SIZE: 64})
    try:
        first = trainer.train()
        for _ in range(3):
            last = trainer.train()
        assert last["mean_distance"] < first["mean_distance"]
    finally:
        trainer.shutdown()
