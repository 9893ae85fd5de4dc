"""Check on the driver, before any worker starts, that a run's storage takes writes.

A small object is written, read back and deleted: that is the only test of a bucket,
credentials and an endpoint that object stores give (listing may be allowed where writing
is not). It runs in a thread with a deadline, so an endpoint that swallows packets costs
``CHECK_TIMEOUT_S``, not a hang; pyarrow's own retries give up on a refused connection
in about 6 s.
"""
from __future__ import annotations

import os
import threading
import uuid
from typing import List

from raysgd.errors import ConfigError, first_line
from raysgd.storage.store import LocalStore, Store

CHECK_TIMEOUT_S = 30.0
# What an object store's error text says -> how to fix it.
_HINTS = (
    (("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist"),
     "the bucket does not exist: create it, or fix its name in the URI"),
    (("ACCESS_DENIED", "AccessDenied", "INVALID_ACCESS_KEY", "InvalidAccessKeyId",
      "SIGNATURE_DOES_NOT_MATCH", "SignatureDoesNotMatch", "credentials", "Forbidden", "403"),
     "the credentials were refused or are missing: set AWS_ACCESS_KEY_ID / "
     "AWS_SECRET_ACCESS_KEY (or your cloud's equivalent), or pass storage_filesystem= "
     "built with them"),
    (("NETWORK_CONNECTION", "curlCode", "Could not connect", "Couldn't resolve", "timed out"),
     "the endpoint cannot be reached: check the URI's host, AWS_ENDPOINT_URL (or "
     "?endpoint_override=...) and the network"),
)


def check_store(store: Store, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Raise :class:`ConfigError` naming the location and the fix unless it takes writes."""
    if isinstance(store, LocalStore):
        _check_local(store.root)
        return
    failure: List[BaseException] = []
    done = threading.Event()

    def probe() -> None:
        name = f".raysgd-probe-{uuid.uuid4().hex[:12]}"
        try:
            store.write(name, b"raysgd")
            if store.read(name) != b"raysgd":
                raise OSError("a probe object read back different bytes")
            store.remove(name)
        except BaseException as exc:  # noqa: BLE001 - reported on the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=probe, name="raysgd-storage-check", daemon=True).start()
    if not done.wait(timeout_s):
        raise ConfigError(f"checkpoint_dir {store.uri} did not answer within {timeout_s:.0f} s: "
                          f"{_HINTS[2][1]}.")
    if failure:
        exc = failure[0]
        raise ConfigError(f"checkpoint_dir {store.uri} cannot be written "
                          f"({type(exc).__name__}: {first_line(exc)}): {hint_for(exc)}.") from exc


def hint_for(exc: BaseException) -> str:
    text = str(exc)
    for needles, hint in _HINTS:
        if any(needle in text for needle in needles):
            return hint
    return "check the URI, the credentials and the endpoint"


def _check_local(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"checkpoint_dir {path} cannot be created ({exc}); pass a directory "
                          "you can write to.") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"checkpoint_dir {path} is not writable; pass a directory you can "
                          "write to.")
