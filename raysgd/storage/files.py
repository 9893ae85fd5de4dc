"""Files on this node's disk, written so a reader sees the old version or the new, never
half: the local half of :mod:`raysgd.storage.store`, used by the checkpoint writers too."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from typing import Iterator, Tuple


class FileRef(str):
    """A file on the reader's own node, named instead of sent: a staged checkpoint's part
    that the driver links or uploads from where the rank wrote it (no copy through Ray)."""


def inside(root: str, relative: str) -> str:
    """``root/relative``, refusing a crafted name that points outside ``root``."""
    full = os.path.realpath(os.path.join(root, relative))
    if not full.startswith(os.path.realpath(root) + os.sep):
        raise ValueError(f"checkpoint file {relative!r} points outside {root}")
    return full


def link_or_copy(source: str, target: str) -> None:
    """A hard link (no copy) where both are on one filesystem, else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def sync_file(path: str) -> None:
    """Wait until ``path``'s contents are on the disk (its data, whichever name wrote it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, sync: bool = True) -> str:
    """Write ``data`` to ``path`` so readers see the old file or the new, never half; synced
    to the disk unless ``sync`` is False (a staged file that is synced where it is placed)."""
    path = os.path.abspath(os.path.expanduser(path))
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".raysgd", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def place_atomic(path: str, source: str) -> str:
    """The file ``source`` (on this node) at ``path`` as :func:`write_atomic` puts bytes
    there: a hard link where both are on one filesystem (no copy), else a copy, made under
    a temporary name, synced and renamed. ``source`` stays where it is."""
    path = os.path.abspath(os.path.expanduser(path))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex}.raysgd")
    try:
        link_or_copy(source, tmp)
        sync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def walk_files(path: str) -> Iterator[Tuple[str, str]]:
    """``(path relative to path, full path)`` of every file under ``path``."""
    for root, _dirs, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            yield os.path.relpath(full, path), full


def replace_dir(new: str, path: str) -> None:
    """Put directory ``new`` at ``path``; an old ``path`` is moved away first, then removed."""
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=".tmp-", suffix=".raysgd", dir=os.path.dirname(path))
        os.rename(path, os.path.join(old, "old"))
    os.rename(new, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
