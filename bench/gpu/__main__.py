"""``python -m bench.gpu``: see :mod:`bench.gpu.cli`."""
import sys

from bench.gpu.cli import main

if __name__ == "__main__":
    sys.exit(main())
