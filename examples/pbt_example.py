"""Population Based Training of a raysgd trainer with Ray Tune.

    python examples/pbt_example.py --smoke-test
    python examples/pbt_example.py --num-workers 2 --address auto

Four trials (two in smoke mode) start from different learning rates; every 2
iterations the worse half copies the state of the better half (through Tune's
checkpoints: models, optimizers, RNGs and raysgd's own position) and continues
with a mutated learning rate. raysgd keeps the recipient's own optimizer
hyperparameters when it loads another trial's state, so the mutation takes effect.
"""
import argparse
import tempfile

import ray
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from torch import nn

from raysgd import TorchTrainer
from raysgd.torch import TrainingOperator
from raysgd.torch.examples.train_example import data_creator, model_creator, optimizer_creator
from raysgd.utils import BATCH_SIZE

LinearOperator = TrainingOperator.from_creators(model_creator, optimizer_creator, data_creator,
                                                loss_creator=nn.MSELoss)


def pbt_example(num_workers=1, use_gpu=False, iterations=8, storage_path=None,
                lrs=(1e-4, 1e-3, 3e-3, 1e-2)):
    trainable = TorchTrainer.as_trainable(training_operator_cls=LinearOperator,
                                          num_workers=num_workers, use_gpu=use_gpu,
                                          config={BATCH_SIZE: 128})
    scheduler = PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=2,
        hyperparam_mutations={"lr": tune.loguniform(1e-4, 1e-1)})
    tuner = tune.Tuner(
        trainable, param_space={"lr": tune.grid_search(list(lrs))},
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", scheduler=scheduler),
        run_config=tune.RunConfig(stop={"training_iteration": iterations},
                                  storage_path=storage_path, verbose=1))
    return tuner.fit().get_best_result()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke-test", action="store_true", help="2 trials of 4 iterations")
    parser.add_argument("--num-workers", type=int, default=1)
    parser.add_argument("--use-gpu", action="store_true")
    parser.add_argument("--address", default=None, help="Ray address, e.g. 'auto'")
    args = parser.parse_args()
    ray.init(address=args.address, num_cpus=None if args.address else 4)
    # Two trials still exploit: PBT's bottom and top quantiles then hold one trial each.
    iterations, lrs = ((4, (1e-4, 1e-2)) if args.smoke_test else
                       (8, (1e-4, 1e-3, 3e-3, 1e-2)))
    with tempfile.TemporaryDirectory() as storage:
        best = pbt_example(args.num_workers, args.use_gpu, iterations, storage, lrs)
    print(f"best trial: lr={best.config['lr']:.2e}, val_loss={best.metrics['val_loss']:.4f}")


if __name__ == "__main__":
    main()
