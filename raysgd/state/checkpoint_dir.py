"""A run's checkpoint directory: numbered checkpoints, retention, an index, ``best``.

Layout::

    checkpoint_dir/
        checkpoint-000012.pt   # the newest ``keep`` checkpoints, same format as save()
        checkpoint-000012/     # ... or, under a sharding strategy, DCP directories
                               #     (raysgd.state.sharded_dir)
        best.pt (or best/)     # the best by checkpoint_score_attr, when asked for
        index.json             # which file is latest, with step/epoch/operator per file

Every file (and directory) is written atomically (see :func:`raysgd.state.checkpoint.write_atomic`)
and the index is replaced only after the file it names is complete, so a
crash at any moment leaves a readable latest checkpoint. Writers (threads or
processes) serialize on an ``flock`` of ``.lock``, so concurrent writes never
lose an index entry or delete a file another writer just listed. Pure file
logic: no Ray, no torch beyond :mod:`raysgd.state.checkpoint`.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from raysgd.errors import CheckpointError
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state import sharded_dir

logger = logging.getLogger("raysgd")

INDEX = "index.json"
BEST = "best.pt"
_NAME = "checkpoint-{seq:06d}"
_NAME_RE = re.compile(r"^checkpoint-(\d{6,})(\.pt)?$")
STALE_TEMP_S = 300.0
RUN_KEY = "raysgd_run"  # the metadata entry inside a checkpoint written here
RANKS_KEY = "ranks"  # the other ranks' parts inside a checkpoint written here
# A checkpoint to write: a file's bytes, or a function that writes a directory at a path.
Content = Union[bytes, Callable[[str], Any]]


def _file_name(stem: str, content: Content) -> str:
    return stem if callable(content) else stem + ".pt"


def _put(path: str, content: Content) -> None:
    if callable(content):
        content(path)
    else:
        checkpoint_io.write_atomic(path, content)


class CheckpointDirectory:
    """Writes and finds the checkpoints of one run directory."""

    def __init__(self, path: str, keep: Optional[int] = 3):
        self.path = os.path.abspath(os.path.expanduser(path))
        self.keep = keep  # None keeps every checkpoint
        self._thread_lock = threading.Lock()

    # ---------------------------------------------------------------- writing
    def write(self, data: Content, meta: Dict[str, Any]) -> str:
        """Add a checkpoint as the new latest; drop the oldest beyond ``keep``.

        A checkpoint of a step already listed replaces that entry (a state change
        between calls, such as ``update_scheduler``, is written at the step of the
        ``train()`` before it), so retention keeps ``keep`` distinct steps.
        """
        with self._locked():
            self._remove_stale_temp_files()
            index = self._read_index()
            entries = index["checkpoints"]
            seq = max((e["seq"] for e in entries), default=self._max_seq_on_disk()) + 1
            name = _file_name(_NAME.format(seq=seq), data)
            _put(os.path.join(self.path, name), data)
            replaced = [e for e in entries if "step" in meta and e.get("step") == meta["step"]]
            entries = [e for e in entries if e not in replaced] + [{**meta, "seq": seq, "file": name}]
            dropped = replaced + (entries[:-self.keep] if self.keep else [])
            index["checkpoints"] = entries[-self.keep:] if self.keep else entries
            index["latest"] = name
            self._write_index(index)
            for entry in dropped:  # only after the index stopped naming them
                sharded_dir.remove(os.path.join(self.path, entry["file"]))
            return os.path.join(self.path, name)

    def write_best(self, data: Content, meta: Dict[str, Any], attr: str, mode: str,
                   score: float) -> str:
        """Replace ``best.pt`` (or ``best/``) with this checkpoint, scored ``attr``=``score``."""
        with self._locked():
            name = _file_name(BEST[:-len(".pt")], data)
            _put(os.path.join(self.path, name), data)
            index = self._read_index()
            stale = (index.get("best") or {}).get("file")
            index["best"] = {**meta, "file": name, "attr": attr, "mode": mode, "score": score}
            self._write_index(index)
            if stale and stale != name:  # the strategy changed between runs
                sharded_dir.remove(os.path.join(self.path, stale))
            return os.path.join(self.path, name)

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
            path = os.path.join(self.path, entry["file"])
            try:
                state = read_checkpoint(path)
            except CheckpointError as exc:
                failures.append(f"{entry['file']}: {exc}")
                logger.warning("raysgd: checkpoint %s is unreadable (%s); trying the one "
                               "before it", path, str(exc).splitlines()[0])
                continue
            return state, entry
        if failures:
            raise CheckpointError(
                f"No readable checkpoint in {self.path}:\n  " + "\n  ".join(failures) +
                "\nPass resume=False (or another checkpoint_dir) to start over.")
        return None

    # ---------------------------------------------------------------- helpers
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        os.makedirs(self.path, exist_ok=True)
        with self._thread_lock, open(os.path.join(self.path, ".lock"), "a") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _read_index(self) -> Dict[str, Any]:
        try:
            with open(os.path.join(self.path, INDEX)) as handle:
                index = json.load(handle)
            if isinstance(index, dict) and isinstance(index.get("checkpoints"), list):
                return index
        except FileNotFoundError:
            if not self._files_on_disk():
                return {"checkpoints": []}
        except (OSError, ValueError):
            pass
        return self._rebuilt_index()

    def _rebuilt_index(self) -> Dict[str, Any]:
        """The index is gone or unreadable: list the checkpoint files by number."""
        files = self._files_on_disk()
        if files:
            logger.warning("raysgd: %s is missing or unreadable; rebuilt it from %d checkpoint "
                           "file(s)", os.path.join(self.path, INDEX), len(files))
        entries = [{"seq": seq, "file": name} for seq, name in files]
        return {"checkpoints": entries, "latest": entries[-1]["file"] if entries else None}

    def _files_on_disk(self) -> List[Tuple[int, str]]:
        found = []
        for path in glob.glob(os.path.join(self.path, "checkpoint-*")):
            match = _NAME_RE.match(os.path.basename(path))
            if match:
                found.append((int(match.group(1)), os.path.basename(path)))
        return sorted(found)

    def _max_seq_on_disk(self) -> int:
        files = self._files_on_disk()
        return files[-1][0] if files else 0

    def _remove_stale_temp_files(self) -> None:
        """Temp files of writes cut short by a crash (a live write is younger than this)."""
        cutoff = time.time() - STALE_TEMP_S
        for path in glob.glob(os.path.join(self.path, ".tmp-*.raysgd")):
            with contextlib.suppress(OSError):
                if os.path.getmtime(path) < cutoff:
                    sharded_dir.remove(path)

    def _write_index(self, index: Dict[str, Any]) -> None:
        data = json.dumps(index, indent=1, sort_keys=True).encode()
        checkpoint_io.write_atomic(os.path.join(self.path, INDEX), data)


def read_checkpoint(path: str) -> Dict[str, Any]:
    """A checkpoint's state: a file's (``save()``'s, or one written here), or a sharded
    directory's in the same layout (rank 0's part, ``RANKS_KEY`` with the others',
    ``RUN_KEY``)."""
    if not os.path.isdir(path):
        return checkpoint_io.load(path)
    meta, parts = sharded_dir.read_dir(path)
    return {**parts[0], RANKS_KEY: parts[1:], RUN_KEY: meta}
