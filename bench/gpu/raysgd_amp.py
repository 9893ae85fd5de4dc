"""Variant: raysgd ``TorchTrainer(num_workers=1, use_local=True, use_fp16=...)``, default loop.

With one local worker there is no Ray and no process group: the figures show
what raysgd's own step (precision object, metrics, commits) costs against the
hand-written loop.
"""
from __future__ import annotations

from raysgd import TorchTrainer

from bench.gpu import RAYSGD_USE_FP16
from bench.gpu.child import parse_args, profiled, report, setup, timed
from bench.gpu.raysgd_operator import PoolOperator


def loss_scale(trainer: TorchTrainer):
    """The GradScaler's scale after the timed steps (fp16 only), through the public state."""
    return (trainer.state_dict().get("precision") or {}).get("scaler", {}).get("scale")


def main() -> None:
    run(__doc__, PoolOperator)


def run(description: str, operator_cls: type) -> None:
    """One raysgd variant run: warm-up, timed steps (and profiled ones when asked), figures."""
    args = parse_args(description)
    workload, device = setup(args)
    use_fp16 = RAYSGD_USE_FP16[args.precision]
    trainer = TorchTrainer(training_operator_cls=operator_cls, num_workers=1,
                           use_gpu=device.type == "cuda", use_local=True, use_fp16=use_fp16,
                           num_cpus_per_worker=args.threads, config={"mode": args.mode},
                           **({"checkpoint_every_n_steps": None} if args.no_commits else {}))
    # Warm-up and timed runs are one train() call each, as a user would make them.
    trainer.train(num_steps=workload.warmup_steps)
    seconds, metrics = timed(lambda: trainer.train(num_steps=workload.timed_steps), device)
    scale = loss_scale(trainer) if args.precision == "fp16" else None
    extra = {"profile": profiled(lambda: trainer.train(num_steps=args.profile_steps), device,
                                 args.profile_steps)} if args.profile_steps else {}
    trainer.shutdown()
    report(workload, args.precision, device, seconds, train_loss=metrics.get("train_loss"),
           loss_scale=scale, use_fp16=use_fp16, **extra)


if __name__ == "__main__":
    main()
