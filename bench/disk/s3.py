"""A local S3 endpoint for the disk benchmark: moto's server (installed with the test
extra), in a process of its own at the lowest CPU priority (nice 19).

A real bucket is across a network: its request handling takes no CPU from the training
machine. moto on this machine must take some (it is Python, parsing every upload: about
180 ms of CPU per 12 MiB upload, where pyarrow's client side takes 13), and on two cores
that both train, any CPU it takes is training time lost. Running it at nice 19 gives it the
cores' idle time first; what it still used is reported beside the figures
(``endpoint_cpu_s``), so the reader can judge. On a machine with cores to spare, ``cpus``
puts it on cores of its own (``python -m bench.disk --training-cpus 0,1 --endpoint-cpus
2-5``): a fair stand-in for the remote endpoint.

``BENCH_S3_SITE``: a directory put first on moto's ``sys.path`` only (tools/gpu_check.sh
carries moto there to a machine without a package index)."""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from typing import Dict, Optional, Set

from bench.procmem import cpu_seconds

# What pyarrow (and boto) need to talk to a local endpoint: any keys, a region, and no
# probing of EC2's metadata service for credentials.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def parse_cpus(text: str) -> Set[int]:
    """``"0,1"``, ``"2-5"`` or ``"0,4-7"``: the CPU numbers, as ``taskset -c`` reads them (an
    ``argparse`` type: its error is shown as is)."""
    cpus: Set[int] = set()
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        if not match or int(match.group(2) or match.group(1)) < int(match.group(1)):
            raise argparse.ArgumentTypeError(f"not a CPU list: {text!r} (give e.g. 0,1 or 2-5)")
        cpus.update(range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1))
    unknown = cpus - os.sched_getaffinity(0)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"CPUs {sorted(unknown)} of {text!r} are not available to this process (it may "
            f"use {sorted(os.sched_getaffinity(0))})")
    return cpus


def pin_process(cpus: Set[int], pid: Optional[int] = None) -> None:
    """Every thread of process ``pid`` (this one by default) on ``cpus``; processes it starts
    later inherit it (``sched_setaffinity`` alone sets one thread's)."""
    pid = pid or os.getpid()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def endpoint_env(url: str) -> Dict[str, str]:
    """The variables that point pyarrow at the endpoint ``url``, as a user would set them."""
    return {**AWS_ENV, "AWS_ENDPOINT_URL": url}


class LocalS3:
    def __init__(self, cpus: Optional[Set[int]] = None) -> None:
        """``cpus``: the CPUs moto may run on (None: any, at nice 19)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ)
        site = os.environ.get("BENCH_S3_SITE")
        if site:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH")) if p)
        self._server = subprocess.Popen(
            ([] if cpus else ["nice", "-n", "19"]) +
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if cpus:  # at once: its threads, started later, inherit it
            pin_process(cpus, self._server.pid)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or self._server.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start")
                time.sleep(0.1)
        # pyarrow reads these as it does for any user (checkpoint_dir="s3://...").
        os.environ.update(endpoint_env(self.url))

    def new_run(self, name: Optional[str] = None) -> str:
        import pyarrow.fs

        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        pyarrow.fs.S3FileSystem(endpoint_override=self.url,
                                allow_bucket_creation=True).create_dir(bucket)
        return f"s3://{bucket}/{name or 'run'}"

    def cpu_seconds(self) -> float:
        """The endpoint process's CPU time so far (user + system)."""
        return cpu_seconds([self._server.pid])

    def stop(self) -> None:
        self._server.kill()
        self._server.wait(10)
