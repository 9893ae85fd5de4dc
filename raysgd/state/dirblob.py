"""A small directory as one picklable value, so a checkpoint written on a worker's node
reaches the driver (and Tune's storage) through Ray's object store, not a shared disk.

On the driver's own node a directory can be named instead (:func:`pin_files`): hard links
to its files in a directory of their own, which stay valid however the writer replaces or
removes the originals, until the reader :func:`unpin` s them."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Dict

from raysgd.storage.files import FileRef, inside, walk_files

DirBlob = Dict[str, bytes]  # path relative to the directory -> file contents
PINNED_PREFIX = "pinned-"


def pack_dir(path: str) -> DirBlob:
    blob: DirBlob = {}
    for relative, full in walk_files(path):
        with open(full, "rb") as handle:
            blob[relative] = handle.read()
    return blob


def pin_files(path: str, beside: str) -> Dict[str, FileRef]:
    """Hard links to the files under ``path`` in a new directory under ``beside`` (same
    filesystem): what :func:`pack_dir` would send, named instead."""
    pinned = tempfile.mkdtemp(prefix=PINNED_PREFIX, dir=beside)
    refs: Dict[str, FileRef] = {}
    for relative, full in walk_files(path):
        target = os.path.join(pinned, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.link(full, target)
        refs[relative] = FileRef(target)
    return refs


def unpin(part: Dict[str, object]) -> None:
    """Remove the pinned directory of a part :func:`pin_files` made (nothing otherwise)."""
    for value in part.values():
        if isinstance(value, FileRef):
            path = str(value)
            while os.path.dirname(path) != path:
                path = os.path.dirname(path)
                if os.path.basename(path).startswith(PINNED_PREFIX):
                    shutil.rmtree(path, ignore_errors=True)
                    return
            return


def unpack_dir(blob: DirBlob, path: str) -> str:
    """Write ``blob`` under ``path`` (created if needed); returns ``path``."""
    root = os.path.realpath(path)
    for relative, data in blob.items():
        full = inside(root, relative)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as handle:
            handle.write(data)
    os.makedirs(root, exist_ok=True)
    return path
