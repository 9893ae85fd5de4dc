"""Variant scripts: each is ``python -m bench.variants.NAME`` and prints one result line."""
