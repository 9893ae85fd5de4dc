"""The disk-checkpoint benchmark: what writing every epoch costs, and what a resume redoes.

``python -m bench.disk [--quick]``; see ``bench/README.md`` ("Disk checkpoints and resume").
"""
