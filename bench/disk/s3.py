"""A local S3 endpoint for the disk benchmark: moto's server (installed with the test
extra), in a process of its own at the lowest CPU priority (nice 19).

A real bucket is across a network: its request handling takes no CPU from the training
machine. moto on this machine must take some (it is Python, parsing every upload), and on
two cores that both train, any CPU it takes is training time lost. Running it at nice 19
gives it the cores' idle time first, which stands in for the remote endpoint; what it
still used is reported beside the figures (``endpoint_cpu_s``), so the reader can judge."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Dict, Optional

# What pyarrow (and boto) need to talk to a local endpoint: any keys, a region, and no
# probing of EC2's metadata service for credentials.
AWS_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def endpoint_env(url: str) -> Dict[str, str]:
    """The variables that point pyarrow at the endpoint ``url``, as a user would set them."""
    return {**AWS_ENV, "AWS_ENDPOINT_URL": url}


class LocalS3:
    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
             "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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
        with open(f"/proc/{self._server.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self._server.kill()
        self._server.wait(10)
