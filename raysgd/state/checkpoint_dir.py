"""A run's checkpoint directory: numbered checkpoints, retention, an index, ``best``.

Layout::

    checkpoint_dir/
        checkpoint-000012.pt   # the newest ``keep`` checkpoints, same format as save()
        checkpoint-000012/     # ... or, under a sharding strategy, DCP directories
                               #     (raysgd.state.sharded_dir)
        best.pt (or best/)     # the best by checkpoint_score_attr, when asked for
        index.json             # which file is latest, with step/epoch/operator per file

The directory lives in a :class:`raysgd.storage.store.Store`: local disk or any
``pyarrow.fs`` filesystem (S3, GCS, ...). A checkpoint is complete or invisible: a file
is written whole (a local rename, or one object), a directory counts only once its
marker (``raysgd-run.json``, written last) exists, and the index is replaced only after
the checkpoint it names is complete, so a crash at any moment leaves a readable latest
checkpoint. Retention deletes only checkpoints the new index no longer names. Writers
serialize on the store's lock (an ``flock`` on local disk, so threads and processes never
lose an index entry; one writer per run directory on an object store). Pure file logic:
no Ray, no torch beyond :mod:`raysgd.state.checkpoint`.
"""
from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from raysgd.errors import CheckpointError, first_line
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state import sharded_dir
from raysgd.storage.store import LocalStore, Store

logger = logging.getLogger("raysgd")

INDEX = "index.json"
BEST = "best.pt"
_NAME = "checkpoint-{seq:06d}"
_NAME_RE = re.compile(r"^checkpoint-(\d{6,})(\.pt)?$")
_TEMP_RE = re.compile(r"^\.tmp-.*\.raysgd$")
STALE_TEMP_S = 300.0
RUN_KEY = "raysgd_run"  # the metadata entry inside a checkpoint written here
RANKS_KEY = "ranks"  # the other ranks' parts inside a checkpoint written here
# A checkpoint to write: a file's bytes, or a function that writes a directory
# (``content(store, rel)``, marker last: raysgd.state.sharded_dir.write_dir).
Content = Union[bytes, Callable[[Store, str], Any]]


def _file_name(stem: str, content: Content) -> str:
    return stem if callable(content) else stem + ".pt"


class CheckpointDirectory:
    """Writes and finds the checkpoints of one run directory (a local path or a store)."""

    def __init__(self, where: Union[str, Store], keep: Optional[int] = 3):
        self.store = where if isinstance(where, Store) else LocalStore(where)
        self.keep = keep  # None keeps every checkpoint

    @property
    def path(self) -> str:
        """Where the directory is, for messages: a local path or a URI."""
        return self.store.uri

    def location(self, name: str) -> str:
        return self.store.child(name)

    def _put(self, name: str, content: Content) -> None:
        if callable(content):
            content(self.store, name)
        else:
            self.store.write(name, content)

    # ---------------------------------------------------------------- writing
    def write(self, data: Content, meta: Dict[str, Any]) -> str:
        """Add a checkpoint as the new latest; drop the oldest beyond ``keep``.

        A checkpoint of a step already listed replaces that entry (a state change
        between calls, such as ``update_scheduler``, is written at the step of the
        ``train()`` before it), so retention keeps ``keep`` distinct steps.
        """
        with self.store.locked():
            index = self._read_index()
            self._remove_leftovers(index)
            entries = index["checkpoints"]
            seq = max((e["seq"] for e in entries), default=self._max_seq_on_disk()) + 1
            name = _file_name(_NAME.format(seq=seq), data)
            self._put(name, data)
            replaced = [e for e in entries if "step" in meta and e.get("step") == meta["step"]]
            entries = [e for e in entries if e not in replaced] + [{**meta, "seq": seq, "file": name}]
            dropped = replaced + (entries[:-self.keep] if self.keep else [])
            index["checkpoints"] = entries[-self.keep:] if self.keep else entries
            index["latest"] = name
            self._write_index(index)
            for entry in dropped:  # only after the index stopped naming them
                self._drop(entry["file"])
            return self.location(name)

    def write_best(self, data: Content, meta: Dict[str, Any], attr: str, mode: str,
                   score: float) -> str:
        """Replace ``best.pt`` (or ``best/``) with this checkpoint, scored ``attr``=``score``."""
        with self.store.locked():
            name = self._best_name(data)
            self._put(name, data)
            index = self._read_index()
            stale = (index.get("best") or {}).get("file")
            index["best"] = {**meta, "file": name, "attr": attr, "mode": mode, "score": score}
            self._write_index(index)
            if stale and stale != name:  # another name: the strategy changed, or a store
                self._drop(stale)
            return self.location(name)

    def _drop(self, name: str) -> None:
        """Remove a checkpoint, its marker first: a removal cut short leaves an unmarked
        directory (ignored, removed later), never a marked one with parts missing."""
        if not name.endswith(".pt"):
            self.store.remove(f"{name}/{sharded_dir.RUN_FILE}")
        self.store.remove(name)

    def _best_name(self, data: Content) -> str:
        """``best.pt`` or ``best``; a directory on an object store, which cannot replace
        one in a single step, gets a new name each time (the index says which)."""
        name = _file_name(BEST[:-len(".pt")], data)
        return name if self.store.local or not callable(data) else f"{name}-{uuid.uuid4().hex[:8]}"

    # ---------------------------------------------------------------- reading
    def entries(self) -> List[Dict[str, Any]]:
        """The index's checkpoints, oldest first (rebuilt from the files if the index is lost)."""
        return self._read_index()["checkpoints"]

    def best(self) -> Optional[Dict[str, Any]]:
        """The index entry of ``best.pt`` (with its score), or None."""
        return self._read_index().get("best")

    def load_latest(self) -> Optional[Tuple[Dict[str, Any], Dict[str, Any]]]:
        """``(state, entry)`` of the newest readable checkpoint, or None when there is none.

        An unreadable newest file (truncated, corrupt) is skipped with a
        warning and the previous one is used; if none can be read, raises.
        """
        entries = self.entries()
        failures = []
        for entry in reversed(entries):
            path = self.location(entry["file"])
            try:
                state = read_checkpoint(self.store, entry["file"])
            except CheckpointError as exc:
                failures.append(f"{entry['file']}: {exc}")
                logger.warning("raysgd: checkpoint %s is unreadable (%s); trying the one "
                               "before it", path, first_line(exc))
                continue
            return state, entry
        if failures:
            raise CheckpointError(
                f"No readable checkpoint in {self.path}:\n  " + "\n  ".join(failures) +
                "\nPass resume=False (or another checkpoint_dir) to start over.")
        return None

    # ---------------------------------------------------------------- helpers
    def _read_index(self) -> Dict[str, Any]:
        try:
            index = json.loads(self.store.read(INDEX))
            if isinstance(index, dict) and isinstance(index.get("checkpoints"), list):
                return index
        except OSError:
            if self.store.exists(INDEX):
                raise  # unreachable, not missing: a rebuilt index would drop its metadata
            if not self._checkpoint_names():
                return {"checkpoints": []}
        except ValueError:  # cut short or not JSON
            pass
        return self._rebuilt_index()

    def _rebuilt_index(self) -> Dict[str, Any]:
        """The index is gone or unreadable: list the complete checkpoints by number."""
        files = [(seq, name) for seq, name in self._checkpoint_names() if self._complete(name)]
        if files:
            logger.warning("raysgd: %s is missing or unreadable; rebuilt it from %d checkpoint "
                           "file(s)", self.location(INDEX), len(files))
        entries = [{"seq": seq, "file": name} for seq, name in files]
        return {"checkpoints": entries, "latest": entries[-1]["file"] if entries else None}

    def _checkpoint_names(self) -> List[Tuple[int, str]]:
        found = []
        for name in self.store.names():
            match = _NAME_RE.match(name)
            if match:
                found.append((int(match.group(1)), name))
        return sorted(found)

    def _complete(self, name: str) -> bool:
        """A file is whole once it exists; a directory once its marker does."""
        return name.endswith(".pt") or self.store.exists(f"{name}/{sharded_dir.RUN_FILE}")

    def _max_seq_on_disk(self) -> int:
        files = self._checkpoint_names()
        return files[-1][0] if files else 0

    def _remove_leftovers(self, index: Dict[str, Any]) -> None:
        """What writes cut short by a crash left: local temporary files older than a live
        write could be, and on an object store the unmarked directories no index names
        (one writer per run directory, so none of them is being written now)."""
        if self.store.local:
            cutoff = time.time() - STALE_TEMP_S
            for name in self.store.names():
                path = self.store.child(name)
                if _TEMP_RE.match(name) and _mtime(path) < cutoff:
                    self.store.remove(name)
            return
        named = {entry["file"] for entry in index["checkpoints"]}
        for _seq, name in self._checkpoint_names():
            if name not in named and not name.endswith(".pt") and not self._complete(name):
                self.store.remove(name)
        best = (index.get("best") or {}).get("file")
        for name in self.store.names():  # a best directory whose index update never came
            if name.startswith(BEST[:-len(".pt")] + "-") and name != best:
                self._drop(name)

    def _write_index(self, index: Dict[str, Any]) -> None:
        self.store.write(INDEX, json.dumps(index, indent=1, sort_keys=True).encode())


def _mtime(path: str) -> float:
    import os

    try:
        return os.path.getmtime(path)
    except OSError:
        return float("inf")


def owned_by_checkpoints(name: str) -> bool:
    """Whether a top-level name of a run directory is this module's (not a logger's)."""
    return bool(_NAME_RE.match(name) or _TEMP_RE.match(name)) or name in (INDEX, ".lock") \
        or name.startswith(("best", ".raysgd-probe-"))


def read_checkpoint(store: Store, name: str) -> Dict[str, Any]:
    """A checkpoint's state: a file's (``save()``'s, or one written here), or a sharded
    directory's in the same layout (rank 0's part, ``RANKS_KEY`` with the others',
    ``RUN_KEY``)."""
    where = store.child(name)
    if not store.is_dir(name):
        try:
            data = store.read(name)
        except OSError:
            if store.exists(name):
                raise  # there, but the storage failed: not a missing checkpoint
            raise CheckpointError(f"No checkpoint at {where}; check the path (or URI) given "
                                  "to load() or checkpoint_dir.") from None
        return checkpoint_io.from_bytes(data, source=f"Checkpoint {where}")
    meta, parts = sharded_dir.read_dir(store, name)
    return {**parts[0], RANKS_KEY: parts[1:], RUN_KEY: meta}
