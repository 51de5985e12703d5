"""Smaller correctness configurations for a task that ships no get_test_inputs().

Every dimension is mapped by value, so dimensions that must agree (a matmul's K, a head count times head
size) stay equal; sizes stay multiples of the (8, 128) tile; a configuration is taken only when both the
reference and the candidate accept it and the candidate's grid is small enough for interpret mode.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from tpu_runner.tasks import ArgSpec, Configuration, Task, concrete_configurations
from tpu_runner.traffic import pallas_traffic


def _shrink(d: int, factor: int) -> int:
    if factor == 1 or d <= 128 or d % factor:
        return d
    small = d // factor
    if d % 128 == 0 and small % 128:
        return d
    if d % 8 == 0 and small % 8:
        return d
    return small


def derive_configurations(task: Task, prod: list[Configuration], ref_fn: Any, cand_fn: Any,
                          max_steps: int) -> tuple[list[Configuration], list[str], list[str]]:
    """Smaller configurations for a task without get_test_inputs: every dimension mapped by value (so related
    dimensions stay equal), keeping multiples of the (8, 128) tile, small enough for interpret mode."""
    ranges: list[list[tuple[int, int] | None]] = [[a.int_range for a in c.dynamic] for c in prod]
    if any(np.issubdtype(np.dtype(a.dtype), np.integer) for c in prod for a in c.dynamic):
        ranges = [[a.int_range for a in c.dynamic] for c in concrete_configurations(task, "get_inputs")]
    configs, names, notes = [], [], []
    for i, config in enumerate(prod):
        dims = sorted({d for a in config.dynamic for d in a.shape})
        chosen = None
        for factor in (64, 32, 16, 8, 4, 2, 1):
            mapping = {d: _shrink(d, factor) for d in dims}
            specs = []
            for a, rng in zip(config.dynamic, ranges[i], strict=True):
                if rng is not None and rng[1] + 1 in mapping:
                    rng = (rng[0], min(rng[1], mapping[rng[1] + 1] - 1))
                specs.append(ArgSpec(tuple(mapping[d] for d in a.shape), a.dtype, rng))
            small = Configuration(tuple(specs), config.static)
            args = [jax.ShapeDtypeStruct(s.shape, np.dtype(s.dtype)) for s in small.dynamic] + list(small.static)
            try:
                jax.eval_shape(jax.jit(ref_fn, static_argnums=small.static_argnums), *args)
                jaxpr = jax.make_jaxpr(cand_fn, static_argnums=small.static_argnums)(*args)
            except Exception:
                continue
            steps = sum(c.grid_steps * c.multiplicity for c in pallas_traffic(jaxpr).calls)
            elements = sum(int(np.prod(s.shape)) for s in small.dynamic)
            if steps <= max_steps and elements <= 1 << 23:
                chosen = small
                break
        if chosen is None:
            notes.append(f"configuration {i} ({config.describe()}): no smaller configuration both the reference and "
                         f"the candidate accept fits interpret mode (<= {max_steps} grid steps); correctness not "
                         "checked")
            continue
        configs.append(chosen)
        names.append(f"derived[{i}]")
        notes.append(f"derived[{i}]: the task has no get_test_inputs; checked on ({chosen.describe()}) derived from "
                     f"({config.describe()})")
    return configs, names, notes
