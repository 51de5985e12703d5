"""Outputs as files: what one process computed, read back in another that never ran the code.

A set of outputs is the pytree's structure (as text) and its leaves, saved with `numpy.savez` (no pickle).
Dtypes numpy cannot name in a file (bfloat16, float8 ...) are stored as their raw bits with the dtype's name
beside them, and come back as the same dtype.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 and friends with numpy
import numpy as np

_NATIVE_KINDS = "biufc"


@dataclass(frozen=True)
class OutputSet:
    tree: str  # the pytree structure, e.g. "PyTreeDef((*, *))"
    leaves: tuple[np.ndarray, ...]
    note: str = ""  # how they were made, where a judgement that uses them should say so (a narrower truth)


def _storable(leaf: np.ndarray) -> tuple[np.ndarray, str]:
    name = leaf.dtype.name
    if leaf.dtype.kind in _NATIVE_KINDS and leaf.dtype.isbuiltin:
        return leaf, name
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[leaf.dtype.itemsize]
    return leaf.view(bits), name


def save_outputs(path: Path, tree: str, leaves: list[Any], note: str = "") -> None:
    """Write `path` (.npz) and its sidecar (.json) atomically."""
    arrays, dtypes = {}, []
    for i, leaf in enumerate(leaves):
        stored, name = _storable(np.asarray(leaf))
        arrays[f"leaf{i}"] = stored
        dtypes.append(name)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    meta = path.with_suffix(".json")
    meta_tmp = meta.with_name(meta.name + f".{os.getpid()}.tmp")
    meta_tmp.write_text(json.dumps({"tree": tree, "dtypes": dtypes, "note": note}))
    tmp.replace(path)
    meta_tmp.replace(meta)


def load_outputs(path: Path) -> OutputSet:
    meta = json.loads(path.with_suffix(".json").read_text())
    with np.load(path, allow_pickle=False) as data:
        leaves = []
        for i, name in enumerate(meta["dtypes"]):
            raw = data[f"leaf{i}"]
            dtype = np.dtype(name)
            leaves.append(raw if raw.dtype == dtype else raw.view(dtype))
    return OutputSet(tree=str(meta["tree"]), leaves=tuple(leaves), note=str(meta.get("note", "")))


def exists(path: Path) -> bool:
    return path.is_file() and path.with_suffix(".json").is_file()
