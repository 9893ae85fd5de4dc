"""``python -m bench.disk``'s CPU pinning options, parsed (no Ray, nothing started)."""
import argparse
import os

import pytest

from bench.disk.__main__ import parse_args
from bench.disk.s3 import parse_cpus


def test_cpu_lists_read_as_taskset_reads_them():
    available = sorted(os.sched_getaffinity(0))
    first, last = available[0], available[-1]
    assert parse_cpus(f"{first}") == {first}
    if available == list(range(first, last + 1)):  # (a container may leave gaps)
        assert parse_cpus(f"{first}-{last}") == set(available)
    assert parse_cpus(f"{first},{last}") == {first, last}
    for bad in ("two", f"{last}-{first - 1}" if first else "1-0", f"{first}-", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="not a CPU list"):
            parse_cpus(bad)
    with pytest.raises(argparse.ArgumentTypeError, match=r"not available to this process"):
        parse_cpus(f"{last + 1}")


def test_training_and_endpoint_cpus_must_not_overlap(capsys):
    cpu = sorted(os.sched_getaffinity(0))[0]
    with pytest.raises(SystemExit):
        parse_args(["--training-cpus", str(cpu), "--endpoint-cpus", str(cpu)])
    assert "share CPUs" in capsys.readouterr().err
    args = parse_args(["--training-cpus", str(cpu)])
    assert args.training_cpus == {cpu} and args.endpoint_cpus is None
