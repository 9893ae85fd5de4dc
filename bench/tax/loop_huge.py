"""Variant: ``bench.tax.loop`` with torch's CPU allocator asking for huge pages, as raysgd's
ranks do by default (``raysgd.worker.huge_pages``): the like-for-like reference for the
tax, where raysgd and the loop differ in nothing but the framework. The variable must be in
the environment before torch's first allocation, so it is set before anything imports torch.
"""
import os

os.environ["THP_MEM_ALLOC_ENABLE"] = "1"

from bench.tax import loop  # noqa: E402 - after the variable, on purpose

if __name__ == "__main__":
    loop.main()
