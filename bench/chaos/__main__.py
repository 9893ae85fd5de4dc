"""``python -m bench.chaos``: see :mod:`bench.chaos.cli`."""
import sys

from bench.chaos.cli import main

if __name__ == "__main__":
    sys.exit(main())
