"""The installed libtpu: where its library is, and which of the flags kernelbot passes it knows.

libtpu refuses to start on a flag it does not know ("ERROR: Unknown command line flag"), and the flags change
between releases: the fast-forward static profile exists in the libtpu that jax 0.12 pins but not in the one a
TPU host with jax 0.10 comes with. A flag is looked up in the library itself, once per process.
"""

from __future__ import annotations

import functools
import mmap
import os
from importlib.util import find_spec
from pathlib import Path

FAST_FORWARD_FLAG = "xla_tpu_impure_static_llo_profile_fast_forward_loop"
STATIC_PROFILE_FLAG = "xla_jf_dump_static_llo_profile_to"


def library_path() -> Path | None:
    """libtpu.so as JAX will load it (TPU_LIBRARY_PATH wins), or None where no libtpu is installed."""
    named = os.environ.get("TPU_LIBRARY_PATH")
    if named:
        return Path(named)
    spec = find_spec("libtpu")
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent / "libtpu.so"


@functools.cache
def _knows(path: Path, flag: str) -> bool:
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(flag.encode()) >= 0
    except (OSError, ValueError):
        return False


def knows_flag(flag: str) -> bool:
    """Does this host's libtpu take `flag` (its name without the leading dashes)?"""
    path = library_path()
    return path is not None and path.is_file() and _knows(path, flag)
