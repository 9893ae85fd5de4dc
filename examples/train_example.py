"""The legacy linear example: fit ``y = 2x + 5`` with ``nn.Linear`` on 2 workers.

    python examples/train_example.py --smoke-test
    python examples/train_example.py --num-workers 2 --epochs 20 --tqdm
    python examples/train_example.py --address auto        # on a running cluster

Prints every epoch's averaged metrics, the validation metrics and the learned
weight and bias (about 2.05 and 4.5 after 20 epochs; 2 and 5 exactly in the limit). The code is the library's
``raysgd.torch.examples.train_example`` (the legacy import path), written in
the creator-function style that legacy RaySGD scripts used.
"""
from raysgd.torch.examples.train_example import main

if __name__ == "__main__":
    main()
