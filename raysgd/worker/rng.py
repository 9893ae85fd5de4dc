"""Capture and restore every RNG a training step may draw from.

States are tensors and plain containers so they also fit ``weights_only``
checkpoint files.
"""
from __future__ import annotations

import random
from typing import Any, Dict

import numpy as np
import torch


def get_state() -> Dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, python_gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        # One tensor rather than a tuple of 625 ints: every commit packs, pickles
        # and writes this, and each int is an object to walk in all three.
        "python": (version, torch.tensor(internal, dtype=torch.int64), python_gauss),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_state(state: Dict[str, Any]) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    if isinstance(internal, torch.Tensor):  # checkpoints before this format hold a tuple
        internal = internal.tolist()
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32),
                         np_state["pos"], np_state["has_gauss"], np_state["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
