"""Stages 2 and 3: lower for the TPU target and compile ahead of time with libtpu, on any host.

Also captures libtpu's static LLO profile (its own cycle estimate per compiled op). The dump directory is
fixed when libtpu starts (`--xla_jf_dump_static_llo_profile_to` in LIBTPU_INIT_ARGS, set by the parent), so
each compile is followed by `StaticProfile.collect()`, which reads and clears what that compile wrote.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from tpu_runner.hardware import ChipSpec

_CYCLES = re.compile(r'hlo_op_name:\s*"([^"]*)"\s*estimated_cycles:\s*(\d+)')


@dataclass
class StaticProfile:
    dump_dir: Path | None

    def collect(self, keep_in: Path | None = None, label: str = "op") -> list[tuple[str, int]]:
        """(op name, estimated cycles) for everything compiled since the last call; files move to keep_in."""
        if self.dump_dir is None or not self.dump_dir.is_dir():
            return []
        ops: list[tuple[str, int]] = []
        for path in sorted(self.dump_dir.glob("*static_llo_profile*")):
            ops.extend((name, int(cycles)) for name, cycles in _CYCLES.findall(path.read_text()))
            if keep_in is not None:
                keep_in.mkdir(parents=True, exist_ok=True)
                path.replace(keep_in / f"{label}.{path.name.replace(' ', '_')}")
            else:
                path.unlink()
        return ops


_topologies: dict[str, Any] = {}
_topologies_lock = threading.Lock()  # libtpu registers its PJRT plugin once: a second concurrent call fails


def target_sharding(chip: ChipSpec) -> jax.sharding.NamedSharding:
    """A single-device sharding on the target topology (libtpu describes it; no TPU needed)."""
    from jax.experimental import topologies

    with _topologies_lock:
        if chip.topology not in _topologies:
            # One chip per host, said outright: libtpu's default (2x2x1 chips, or this TPU host's own layout) does
            # not divide a one-chip topology, and older libtpu refuses "v5e=1x1" without it.
            _topologies[chip.topology] = topologies.get_topology_desc(chip.topology, "tpu",
                                                                      chips_per_host_bounds=[1, 1, 1])
        topo = _topologies[chip.topology]
    mesh = jax.sharding.Mesh(np.array(topo.devices[:1]), ("x",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
