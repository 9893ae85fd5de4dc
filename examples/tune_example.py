"""Grid search over the learning rate with Ray Tune, as in the legacy RaySGD guide.

    python examples/tune_example.py --smoke-test
    python examples/tune_example.py --num-workers 2 --address auto

Each trial runs a 2-worker (by default) ``TorchTrainer`` on the linear data
set; ``step()`` is one ``train()`` plus one ``validate()``, with metrics
averaged over the workers. The best learning rate is printed at the end.
"""
import argparse
import tempfile

import ray
from ray import tune
from torch import nn

from raysgd import TorchTrainer
from raysgd.torch import TrainingOperator
from raysgd.torch.examples.train_example import data_creator, model_creator, optimizer_creator
from raysgd.utils import BATCH_SIZE

LinearOperator = TrainingOperator.from_creators(model_creator, optimizer_creator, data_creator,
                                                loss_creator=nn.MSELoss)


def tune_example(num_workers=2, use_gpu=False, iterations=3, storage_path=None):
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator,
                                          num_workers=num_workers, use_gpu=use_gpu,
                                          config={BATCH_SIZE: 128})
    analysis = tune.run(trainable, num_samples=1,
                        config={"lr": tune.grid_search([1e-4, 1e-3, 1e-2])},
                        stop={"training_iteration": iterations}, verbose=1,
                        storage_path=storage_path)
    return analysis.get_best_config(metric="val_loss", mode="min")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-test", action="store_true", help="1 worker, 2 iterations")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    args = parser.parse_args()
    ray.init(address=args.address, num_cpus=None if args.address else 4)
    workers, iterations = (1, 2) if args.smoke_test else (args.num_workers, 3)
    with tempfile.TemporaryDirectory() as storage:
        best = tune_example(workers, args.use_gpu, iterations, storage)
    print(f"best config: {best}")


if __name__ == "__main__":
    main()
