"""A small directory as one picklable value, so a checkpoint written on a worker's node
reaches the driver (and Tune's storage) through Ray's object store, not a shared disk."""
from __future__ import annotations

import os
from typing import Dict

from raysgd.storage.store import FileRef

DirBlob = Dict[str, bytes]  # path relative to the directory -> file contents


def list_files(path: str) -> Dict[str, FileRef]:
    """Like :func:`pack_dir`, but the files' paths instead of their contents."""
    return {os.path.relpath(os.path.join(root, name), path): FileRef(os.path.join(root, name))
            for root, _dirs, files in os.walk(path) for name in files}


def pack_dir(path: str) -> DirBlob:
    blob: DirBlob = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as handle:
                blob[os.path.relpath(full, path)] = handle.read()
    return blob


def unpack_dir(blob: DirBlob, path: str) -> str:
    """Write ``blob`` under ``path`` (created if needed); returns ``path``."""
    root = os.path.realpath(path)
    for relative, data in blob.items():
        full = os.path.realpath(os.path.join(root, relative))
        if not full.startswith(root + os.sep):  # a crafted blob must not write elsewhere
            raise ValueError(f"checkpoint file {relative!r} points outside {path}")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as handle:
            handle.write(data)
    os.makedirs(root, exist_ok=True)
    return path
