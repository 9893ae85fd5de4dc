"""A local S3 endpoint for the disk benchmark: moto's server (installed with the test
extra) in a thread of the benchmark's process, as the tests use. It shares the machine's
cores with the training, as any endpoint on the same host would; a real bucket is across
a network instead, which moves the upload's cost from CPU to waiting."""
from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Optional


class LocalS3:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        # pyarrow reads these as it does for any user (checkpoint_dir="s3://...").
        os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                          AWS_DEFAULT_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                          AWS_ENDPOINT_URL=f"http://127.0.0.1:{self.port}")

    def new_run(self, name: Optional[str] = None) -> str:
        import pyarrow.fs

        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        pyarrow.fs.S3FileSystem(allow_bucket_creation=True).create_dir(bucket)
        return f"s3://{bucket}/{name or 'run'}"

    def stop(self) -> None:
        self._server.stop()
