"""A sharded checkpoint as a directory: DCP's files plus each rank's small part.

Layout (``checkpoint_dir/checkpoint-000012/``)::

    .metadata, __0_0.distcp, __1_0.distcp, ...   # torch.distributed.checkpoint (DCP):
                                                 # {"models": ..., "optimizers": ...}
    raysgd-rank0.pt, raysgd-rank1.pt, ...        # each rank's position and RNGs; rank 0's
                                                 # also schedulers, precision, operator state
    raysgd-run.json                              # operator, world size, step, epoch

Each rank writes its own files on its own node (``raysgd.worker.staging``); the driver
gathers them here one rank at a time (:func:`write_dir`), so no shared filesystem is
needed and the driver never holds more than one rank's files. Plain torch reads the
weights: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(path, "out.pt")``,
or ``dcp.load`` into a model of any sharding. Pure file logic: no Ray.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
from typing import Any, Dict, Iterable, List, Tuple

from raysgd.errors import CheckpointError
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.dirblob import DirBlob, pack_dir, unpack_dir

RUN_FILE = "raysgd-run.json"
RANK_FILE = "raysgd-rank{rank}.pt"
_RANK_RE = re.compile(r"^raysgd-rank(\d+)\.pt$")
SHARDED_KEY = "sharded"  # a rank's part: {"files": DCP's files, "models": n, "optimizers": n}


def write_dir(parts: Iterable[DirBlob], meta: Dict[str, Any], path: str) -> str:
    """Write every rank's staged files and ``meta`` as the directory ``path``, atomically:
    readers see the old directory or the complete new one, never part of it."""
    parent = os.path.dirname(path)
    tmp = tempfile.mkdtemp(prefix=".tmp-", suffix=".raysgd", dir=parent)
    try:
        for part in parts:
            unpack_dir(part, tmp)
        with open(os.path.join(tmp, RUN_FILE), "w", encoding="utf-8") as handle:
            json.dump(meta, handle, sort_keys=True)
        _check_complete(tmp, meta)
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _check_complete(path: str, meta: Dict[str, Any]) -> None:
    ranks = sorted(_rank_files(path))
    want = int(meta.get("world_size", len(ranks)))
    has_metadata = os.path.exists(os.path.join(path, ".metadata"))
    if ranks != list(range(want)) or not has_metadata:
        raise CheckpointError(f"The staged checkpoint of step {meta.get('step')} is incomplete "
                              f"(ranks {ranks} of {want}, DCP metadata "
                              f"{'present' if has_metadata else 'missing'}).")


def replace_dir(new: str, path: str) -> None:
    """Put directory ``new`` at ``path``; an old ``path`` is moved away first, then removed."""
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=".tmp-", suffix=".raysgd", dir=os.path.dirname(path))
        os.rename(path, os.path.join(old, "old"))
    os.rename(new, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_dir(path: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """``(meta, every rank's part in rank order)``; rank 0's part carries DCP's files."""
    try:
        with open(os.path.join(path, RUN_FILE), encoding="utf-8") as handle:
            meta = json.load(handle)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Checkpoint directory {path} has no readable {RUN_FILE} "
                              f"({exc}); it was not written completely.") from exc
    ranks = _rank_files(path)
    parts = [checkpoint_io.load(os.path.join(path, ranks[rank])) for rank in sorted(ranks)]
    if not parts or sorted(ranks) != list(range(len(parts))):
        raise CheckpointError(f"Checkpoint directory {path} lacks the parts of some ranks "
                              f"(found ranks {sorted(ranks)}).")
    files = {name: data for name, data in pack_dir(path).items()
             if name != RUN_FILE and not _RANK_RE.match(name)}
    parts[0][SHARDED_KEY] = {**parts[0].get(SHARDED_KEY, {}), "files": files}
    return meta, parts


def _rank_files(path: str) -> Dict[int, str]:
    found = {}
    for name in os.listdir(path):
        match = _RANK_RE.match(name)
        if match:
            found[int(match.group(1))] = name
    return found


def remove(path: str) -> None:
    """Remove a checkpoint, a file or a directory."""
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
