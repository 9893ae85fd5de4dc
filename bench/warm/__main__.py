"""``python -m bench.warm``: see :mod:`bench.warm.cli`."""
import sys

from bench.warm.cli import main

if __name__ == "__main__":
    sys.exit(main())
