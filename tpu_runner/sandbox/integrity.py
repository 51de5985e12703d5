"""Did the candidate change the functions the pipeline relies on?

Taken before the candidate is imported and checked after it ran: every public function and class of the JAX,
numpy and pipeline modules the child uses afterwards, by identity and by code object. Patching one of them
(reflection on a library is refused by the static check; anything it lets through is caught here) would let a
candidate change how its outputs are saved, its program lowered or its time measured; a changed entry stops the
evaluation as `harness_tamper`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

WATCHED_MODULES = (
    "jax", "jax.numpy", "jax.lax", "jax.tree", "jax.tree_util", "jax.export", "jax.stages", "jax.sharding",
    "jax.experimental.pallas", "jax.experimental.pallas.tpu", "numpy", "json",
    "tpu_runner.checking.arrays", "tpu_runner.checking.correctness", "tpu_runner.checking.compare",
    "tpu_runner.checking.checkshapes", "tpu_runner.tasks.inputs", "tpu_runner.tasks.task",
    "tpu_runner.analysis.traffic", "tpu_runner.analysis.coverage", "tpu_runner.analysis.structure",
    "tpu_runner.analysis.jaxpr_walk", "tpu_runner.analysis.ir", "tpu_runner.compiler.aot", "tpu_runner.candidate.child",
    "tpu_runner.timing.measure", "jax.profiler", "jax._src.profiler",
)


@dataclass(frozen=True)
class Snapshot:
    entries: dict[tuple[str, str], tuple[int, int | None]]


def _fingerprint(value: Any) -> tuple[int, int | None]:
    code = getattr(value, "__code__", None)
    return id(value), id(code) if code is not None else None


def _modules() -> list[tuple[str, ModuleType]]:
    return [(name, sys.modules[name]) for name in WATCHED_MODULES if name in sys.modules]


def take_snapshot() -> Snapshot:
    entries: dict[tuple[str, str], tuple[int, int | None]] = {}
    for name, module in _modules():
        for attr, value in vars(module).items():
            if attr.startswith("__") or not callable(value):
                continue
            entries[(name, attr)] = _fingerprint(value)
    return Snapshot(entries)


def changes_since(snapshot: Snapshot) -> list[str]:
    """`module.name` of every watched function or class replaced, removed or given other code."""
    changed = []
    for (module_name, attr), before in snapshot.entries.items():
        module = sys.modules.get(module_name)
        value = vars(module).get(attr) if module is not None else None
        if value is None or _fingerprint(value) != before:
            changed.append(f"{module_name}.{attr}")
    return sorted(changed)
