"""``python -m bench.data``: see :mod:`bench.data.cli`."""
import sys

from bench.data.cli import main

if __name__ == "__main__":
    sys.exit(main())
