"""Where a run's files go: a local directory or any ``pyarrow.fs`` filesystem (S3, GCS,
Azure, HDFS), behind one small interface.

:func:`open_store` turns ``checkpoint_dir`` (a path or a URI) and an optional
``storage_filesystem`` into a :class:`LocalStore` or an :class:`ArrowStore`, once, on the
driver; the checkpoint directory, the sharded-directory writer and the log mirror then
call the store and never ask which it is. Paths given to a store are relative to its root,
``/``-separated.

The two differ where the media differ. A local directory has rename and ``flock``: a file
is written to a temporary name and renamed, a directory is built beside its place and
renamed into it, and writers of one directory (threads or processes) take a lock. An
object store has neither, but a single object appears whole or not at all: a file is one
object, a directory is visible only once its marker file (written last by the caller)
exists, and one run directory has one writer (the driver's thread).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import uuid
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union
from urllib.parse import urlparse

from raysgd.errors import ConfigError
from raysgd.storage.files import (FileRef, inside, link_or_copy, place_atomic, replace_dir,
                                  sync_file, walk_files, write_atomic)

# Schemes pyarrow opens (Ray Train's storage_path takes the same ones).
SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs", "file", "mock")


OBJECT_STORES = ("s3", "gcs", "abfs")  # pyarrow's type_name of stores without directories
Data = Union[bytes, FileRef]  # a file's contents, or a file on this node to take them from
PutFile = Callable[[str, Data], None]


def is_uri(target: Any) -> bool:
    """``s3://bucket/run`` and the like (a Windows drive letter is not a scheme)."""
    return isinstance(target, str) and len(urlparse(target).scheme) > 1 and "://" in target


def open_store(target: Any, filesystem: Any = None) -> "Store":
    """The store rooted at ``target``: a local path, a URI, or (with ``filesystem``, a
    ``pyarrow.fs.FileSystem``) a path inside that filesystem."""
    if not isinstance(target, (str, os.PathLike)):
        raise ConfigError(f"checkpoint_dir must be a path or a URI such as 's3://bucket/run', "
                          f"got {type(target).__name__}.")
    target = os.fspath(target)
    if filesystem is not None:
        return _with_filesystem(target, filesystem)
    if not is_uri(target):
        return LocalStore(target)
    scheme = urlparse(target).scheme
    if scheme == "file":
        return LocalStore(urlparse(target).path)
    if scheme not in SCHEMES:
        raise ConfigError(f"checkpoint_dir {target!r} has the scheme {scheme!r}, which raysgd "
                          f"cannot open; use a local path or one of "
                          f"{', '.join(s + '://' for s in SCHEMES if s != 'mock')}, or pass "
                          "storage_filesystem= (a pyarrow.fs.FileSystem) with a plain path.")
    import pyarrow.fs

    try:
        fs, path = pyarrow.fs.FileSystem.from_uri(target)
    except Exception as exc:  # pyarrow: ArrowInvalid, OSError, ... for an unusable URI
        raise ConfigError(f"checkpoint_dir {target!r} cannot be opened ({type(exc).__name__}: "
                          f"{exc}). Check the URI, or build the filesystem yourself and pass "
                          "it as storage_filesystem=.") from exc
    return ArrowStore(fs, path, target)


def _with_filesystem(target: str, filesystem: Any) -> "Store":
    import pyarrow.fs

    if not isinstance(filesystem, pyarrow.fs.FileSystem):
        raise ConfigError(
            f"storage_filesystem must be a pyarrow.fs.FileSystem (for an fsspec filesystem: "
            f"pyarrow.fs.PyFileSystem(pyarrow.fs.FSSpecHandler(fs))), got "
            f"{type(filesystem).__name__}.")
    path = urlparse(target).netloc + urlparse(target).path if is_uri(target) else target
    if isinstance(filesystem, pyarrow.fs.LocalFileSystem):
        return LocalStore(path)
    return ArrowStore(filesystem, path.rstrip("/"), f"{filesystem.type_name}:{path}")


def split_target(target: Any, filesystem: Any = None) -> Tuple["Store", str]:
    """A file's store (its parent directory) and name: for ``save(uri)`` / ``load(uri)``."""
    text = os.fspath(target) if isinstance(target, os.PathLike) else target
    if not isinstance(text, str) or not text.rstrip("/"):
        raise ConfigError(f"A checkpoint path must be a non-empty path or URI, got {target!r}.")
    if not is_uri(text) and filesystem is None:
        parent, name = os.path.split(os.path.abspath(os.path.expanduser(text)))
        return open_store(parent, filesystem), name
    base, query = _split_query(text)
    parent, _, name = base.rstrip("/").rpartition("/")
    if is_uri(text) and "://" not in parent:  # "s3://bucket" itself: no parent
        raise ConfigError(f"{target!r} names a bucket, not a file in it; add a file name.")
    return open_store((parent or ".") + query, filesystem), name


def _split_query(uri: str) -> Tuple[str, str]:
    """``("s3://b/run", "?region=x")`` for ``s3://b/run?region=x`` (options stay at the end)."""
    base, mark, query = uri.partition("?")
    return base, mark + query


class Store:
    """The operations a run directory needs; ``uri`` is what messages show."""

    uri: str
    local: bool

    def write(self, rel: str, data: bytes) -> None:
        raise NotImplementedError

    def read(self, rel: str) -> bytes:
        raise NotImplementedError

    def exists(self, rel: str) -> bool:
        raise NotImplementedError

    def is_dir(self, rel: str) -> bool:
        raise NotImplementedError

    def names(self, rel: str = "") -> List[str]:
        """Names directly under ``rel`` (files and directories); none if it is missing."""
        raise NotImplementedError

    def files(self, rel: str) -> List[str]:
        """Every file under the directory ``rel``, as paths relative to it."""
        raise NotImplementedError

    def remove(self, rel: str) -> None:
        """Remove a file or a directory tree; a missing one is no error."""
        raise NotImplementedError

    def staging_dir(self) -> str:
        """A local directory for files to be handed to :meth:`write` as a :class:`FileRef`."""
        return tempfile.gettempdir()

    def locked(self) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    @contextlib.contextmanager
    def building_dir(self, rel: str) -> Iterator[PutFile]:
        """Write the directory ``rel`` file by file: ``put(name, data)``. The caller writes
        the directory's marker file last; readers ignore a directory without it."""
        raise NotImplementedError
        yield  # pragma: no cover

    def child(self, rel: str) -> str:
        base, query = _split_query(self.uri)
        return f"{base.rstrip('/')}/{rel}{query}" if rel else self.uri


class LocalStore(Store):
    """A directory on this node's disk: atomic renames and an ``flock`` across processes."""

    local = True

    def __init__(self, path: str):
        self.root = os.path.abspath(os.path.expanduser(path))
        self.uri = self.root
        self._thread_lock = threading.Lock()

    def path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def child(self, rel: str) -> str:
        return self.path(rel)

    def write(self, rel: str, data: Data) -> None:
        if isinstance(data, FileRef):
            place_atomic(self.path(rel), data)
        else:
            write_atomic(self.path(rel), data)

    def read(self, rel: str) -> bytes:
        with open(self.path(rel), "rb") as handle:
            return handle.read()

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def is_dir(self, rel: str) -> bool:
        return os.path.isdir(self.path(rel))

    def names(self, rel: str = "") -> List[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def files(self, rel: str) -> List[str]:
        return sorted(relative.replace(os.sep, "/") for relative, _ in walk_files(self.path(rel)))

    def staging_dir(self) -> str:
        """The run directory itself: a file staged here is linked into place, not copied
        (a stale one has a temporary name, which the checkpoint directory clears)."""
        os.makedirs(self.root, exist_ok=True)
        return self.root

    def remove(self, rel: str) -> None:
        path = self.path(rel)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        os.makedirs(self.root, exist_ok=True)
        with self._thread_lock, open(os.path.join(self.root, ".lock"), "a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    @contextlib.contextmanager
    def building_dir(self, rel: str) -> Iterator[PutFile]:
        """Built in a temporary directory beside its place and renamed into it, so a local
        directory is also never seen half-written. Every file is synced here, on the
        writer's thread: the ranks stage theirs unsynced, off the training path."""
        target = self.path(rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", suffix=".raysgd", dir=os.path.dirname(target))

        def put(name: str, data: Data) -> None:
            full = inside(tmp, name)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            if isinstance(data, FileRef):
                link_or_copy(data, full)
                sync_file(full)
                return
            with open(full, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())

        try:
            yield put
            replace_dir(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


class ArrowStore(Store):
    """A ``pyarrow.fs`` filesystem: S3 and the other object stores, HDFS, or a user's own."""

    local = False

    def __init__(self, fs: Any, root: str, uri: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.uri = uri.rstrip("/")
        self._lock = threading.RLock()

    def path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def write(self, rel: str, data: Data) -> None:
        path = self.path(rel)
        if self.fs.type_name not in OBJECT_STORES:  # HDFS and the like want the directory
            self.fs.create_dir(path.rpartition("/")[0], recursive=True)
        if self.fs.type_name in OBJECT_STORES:  # one object: whole or not at all
            self._put(path, data)
            return
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"  # a file system: written, then moved
        try:
            self._put(tmp, data)
            self.fs.move(tmp, path)
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.delete_file(tmp)
            raise

    def _put(self, path: str, data: Data) -> None:
        if isinstance(data, FileRef):  # streamed by pyarrow: never Python bytes
            import pyarrow.fs

            pyarrow.fs.copy_files(data, path, source_filesystem=pyarrow.fs.LocalFileSystem(),
                                  destination_filesystem=self.fs)
            return
        with self.fs.open_output_stream(path) as handle:
            handle.write(data)

    def read(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as handle:
            return handle.read()

    def _info(self, rel: str) -> Any:
        return self.fs.get_file_info(self.path(rel))

    def exists(self, rel: str) -> bool:
        import pyarrow.fs

        return self._info(rel).type != pyarrow.fs.FileType.NotFound

    def is_dir(self, rel: str) -> bool:
        import pyarrow.fs

        return self._info(rel).type == pyarrow.fs.FileType.Directory

    def names(self, rel: str = "") -> List[str]:
        import pyarrow.fs

        selector = pyarrow.fs.FileSelector(self.path(rel), allow_not_found=True)
        return sorted(info.base_name for info in self.fs.get_file_info(selector))

    def files(self, rel: str) -> List[str]:
        import pyarrow.fs

        top = self.path(rel)
        selector = pyarrow.fs.FileSelector(top, recursive=True, allow_not_found=True)
        return sorted(info.path[len(top) + 1:] for info in self.fs.get_file_info(selector)
                      if info.type == pyarrow.fs.FileType.File)

    def remove(self, rel: str) -> None:
        import pyarrow.fs

        kind = self._info(rel).type
        if kind == pyarrow.fs.FileType.Directory:
            self.fs.delete_dir(self.path(rel))
        elif kind == pyarrow.fs.FileType.File:
            self.fs.delete_file(self.path(rel))

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        # No cross-process lock on an object store: one run directory, one writer.
        with self._lock:
            yield

    @contextlib.contextmanager
    def building_dir(self, rel: str) -> Iterator[PutFile]:
        self.remove(rel)  # a leftover of a write cut short (it had no marker)
        yield lambda name, data: self.write(f"{rel}/{name}", data)


def local_path(store: Store) -> Optional[str]:
    return store.root if isinstance(store, LocalStore) else None
