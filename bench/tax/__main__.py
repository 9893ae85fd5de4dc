"""``python -m bench.tax``: see ``bench.tax.cli``."""
import sys

from bench.tax.cli import main

if __name__ == "__main__":
    sys.exit(main())
