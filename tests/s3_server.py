"""A real S3-compatible endpoint on localhost for the storage tests: moto's standalone
server (``moto[server]``), in a thread of the test process, so stopping and starting it
again keeps the buckets (a storage outage mid-run, then recovery)."""
from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Dict

from bench.disk.s3 import endpoint_env, free_port  # noqa: F401 - free_port: for the tests


class S3Endpoint:
    """``start()``/``stop()`` on one fixed port; ``env`` points pyarrow (and boto) at it."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request else
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.env: Dict[str, str] = endpoint_env(self.url)
        self.running = False

    def start(self) -> None:
        deadline = time.monotonic() + 10
        while True:  # the port of a stopped server may linger a moment
            try:
                self._server.start()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.running = True

    def stop(self) -> None:
        self._server.stop()
        self.running = False

    def filesystem(self, attempts: int = 3):
        """A filesystem on this endpoint; ``attempts=1`` fails at once when it is down
        (pyarrow's default tries 3 times over about 6 s)."""
        import pyarrow.fs

        return pyarrow.fs.S3FileSystem(
            endpoint_override=self.url, access_key="testing", secret_key="testing",
            region="us-east-1", allow_bucket_creation=True, allow_bucket_deletion=True,
            retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=attempts))

    def new_bucket(self) -> str:
        name = f"raysgd-{uuid.uuid4().hex[:10]}"
        self.filesystem().create_dir(name)
        return name


def exported(endpoint: S3Endpoint) -> Dict[str, str]:
    """``os.environ`` with the endpoint's variables: for driver subprocesses."""
    return {**os.environ, **endpoint.env}
