"""The loggers' files on a run directory that is not a local path.

Loggers write files with ordinary file calls (``metrics.csv``, TensorBoard's event files,
MLflow's ``mlruns/`` store), which an object store does not take. With a remote
``checkpoint_dir`` they write into a local directory instead, and a :class:`LogMirror`
copies it both ways: :meth:`pull` brings the run's earlier files down before the loggers
start (so a resumed run's ``metrics.csv`` goes on where it was), :meth:`push` uploads every
file that changed since the last push; the recorder calls it on the loggers' thread after
each record, so training never waits for it. A push the storage refuses is warned about
once and tried again with the next record.
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Callable, Dict, Tuple

from raysgd.storage.store import Store

logger = logging.getLogger("raysgd")


class LogMirror:
    """A local directory kept equal to the loggers' files of ``store``."""

    def __init__(self, store: Store, owned_by_checkpoints: Callable[[str], bool]):
        """``owned_by_checkpoints(name)``: whether a top-level name is the checkpoint
        directory's own (checkpoints, index, ``best``), which the mirror leaves alone."""
        self.store = store
        self.local_dir = tempfile.mkdtemp(prefix="raysgd-logs-")
        self._owned = owned_by_checkpoints
        self._pushed: Dict[str, Tuple[int, int]] = {}  # relative path -> (size, mtime_ns)
        self._warned = False

    def pull(self) -> None:
        """Download the run's logger files (a resumed run continues them)."""
        for name in self.store.names():
            if self._owned(name):
                continue
            rels = [f"{name}/{rel}" for rel in self.store.files(name)] \
                if self.store.is_dir(name) else [name]
            for rel in rels:
                path = os.path.join(self.local_dir, *rel.split("/"))
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as handle:
                    handle.write(self.store.read(rel))
                self._pushed[rel] = _signature(path)

    def push(self) -> bool:
        """Upload the files that changed; False (after one warning) if the storage failed."""
        try:
            for rel, path in self._local_files():
                signature = _signature(path)
                if self._pushed.get(rel) != signature:
                    with open(path, "rb") as handle:
                        self.store.write(rel, handle.read())
                    self._pushed[rel] = signature
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("raysgd: could not copy the loggers' files to %s (%s: %s); "
                               "they stay in %s and are tried again with the next record",
                               self.store.uri, type(exc).__name__, exc, self.local_dir)
            return False
        self._warned = False
        return True

    def close(self) -> bool:
        """A last push; the local copy is removed once everything reached the storage."""
        pushed = self.push()
        if pushed:
            shutil.rmtree(self.local_dir, ignore_errors=True)
        else:
            logger.warning("raysgd: the loggers' files did not reach %s; they are in %s",
                           self.store.uri, self.local_dir)
        return pushed

    def _local_files(self):
        for root, _dirs, names in os.walk(self.local_dir):
            for name in names:
                path = os.path.join(root, name)
                yield os.path.relpath(path, self.local_dir).replace(os.sep, "/"), path


def _signature(path: str) -> Tuple[int, int]:
    stat = os.stat(path)
    return stat.st_size, stat.st_mtime_ns
