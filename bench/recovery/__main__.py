"""``python -m bench.recovery``: see :mod:`bench.recovery.cli`."""
import sys

from bench.recovery.cli import main

if __name__ == "__main__":
    sys.exit(main())
