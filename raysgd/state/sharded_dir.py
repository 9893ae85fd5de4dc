"""A sharded checkpoint as a directory: DCP's files plus each rank's small part.

Layout (``checkpoint_dir/checkpoint-000012/``)::

    .metadata, __0_0.distcp, __1_0.distcp, ...   # torch.distributed.checkpoint (DCP):
                                                 # {"models": ..., "optimizers": ...}
    raysgd-rank0.pt, raysgd-rank1.pt, ...        # each rank's position and RNGs; rank 0's
                                                 # also schedulers, precision, operator state
    raysgd-run.json                              # operator, world size, step, epoch

Each rank writes its own files on its own node (``raysgd.worker.staging``); the driver
gathers them here one rank at a time (:func:`write_dir`), so no shared filesystem is
needed and the driver never holds more than one rank's files. ``raysgd-run.json`` is
written last: on an object store, where a directory cannot appear at once, it is the
marker that makes the directory a checkpoint. Plain torch reads the
weights: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save(path, "out.pt")``,
or ``dcp.load`` into a model of any sharding. Pure file logic: no Ray.
"""
from __future__ import annotations

import json
import re
from typing import Any, Collection, Dict, Iterable, List, Tuple

from raysgd.errors import CheckpointError
from raysgd.state import checkpoint as checkpoint_io
from raysgd.state.dirblob import DirBlob
from raysgd.storage.store import Store

RUN_FILE = "raysgd-run.json"
RANK_FILE = "raysgd-rank{rank}.pt"
_RANK_RE = re.compile(r"^raysgd-rank(\d+)\.pt$")
SHARDED_KEY = "sharded"  # a rank's part: {"files": DCP's files, "models": n, "optimizers": n}


def write_dir(parts: Iterable[DirBlob], meta: Dict[str, Any], store: Store, rel: str) -> str:
    """Write every rank's staged files and ``meta`` as the directory ``rel`` of ``store``:
    readers see the complete directory or none (see ``Store.building_dir``)."""
    with store.building_dir(rel) as put:
        names = set()
        for part in parts:
            for name, data in part.items():
                put(name, data)
                names.add(name)
        _check_complete(names, meta)
        put(RUN_FILE, json.dumps(meta, sort_keys=True).encode())  # last: the marker
    return store.child(rel)


def _check_complete(names: Collection[str], meta: Dict[str, Any]) -> None:
    ranks = sorted(_rank_numbers(names))
    want = int(meta.get("world_size", len(ranks)))
    has_metadata = ".metadata" in names
    if ranks != list(range(want)) or not has_metadata:
        raise CheckpointError(f"The staged checkpoint of step {meta.get('step')} is incomplete "
                              f"(ranks {ranks} of {want}, DCP metadata "
                              f"{'present' if has_metadata else 'missing'}).")


def read_dir(store: Store, rel: str) -> Tuple[Dict[str, Any], List[Dict[str, Any]]]:
    """``(meta, every rank's part in rank order)``; rank 0's part carries DCP's files."""
    where = store.child(rel)
    try:
        meta = json.loads(store.read(f"{rel}/{RUN_FILE}"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"Checkpoint directory {where} has no readable {RUN_FILE} "
                              f"({exc}); it was not written completely.") from exc
    names = store.files(rel)
    ranks = _rank_numbers(names)
    parts = [checkpoint_io.from_bytes(store.read(f"{rel}/{ranks[rank]}"),
                                      source=f"Checkpoint {where}/{ranks[rank]}")
             for rank in sorted(ranks)]
    if not parts or sorted(ranks) != list(range(len(parts))):
        raise CheckpointError(f"Checkpoint directory {where} lacks the parts of some ranks "
                              f"(found ranks {sorted(ranks)}).")
    files = {name: store.read(f"{rel}/{name}") for name in names
             if name != RUN_FILE and not _RANK_RE.match(name)}
    parts[0][SHARDED_KEY] = {**parts[0].get(SHARDED_KEY, {}), "files": files}
    return meta, parts


def _rank_numbers(names: Iterable[str]) -> Dict[int, str]:
    found = {}
    for name in names:
        match = _RANK_RE.match(name)
        if match:
            found[int(match.group(1))] = name
    return found
