"""Does the production grid write every element of every blocked output?

A kernel whose grid or output index map skips part of its output (a quarter of the rows at production size)
leaves that part as whatever the buffer held. Interpret mode at small shapes cannot see it when the skip only
happens at large shapes, but the grid and the output BlockSpecs say it exactly: the output blocks written are
the index map's values over the grid, and every block of the array must be among them.

Outputs the kernel writes itself (memory space ANY, or index maps that read scalar-prefetch values known
only at run time) cannot be checked this way; they are reported as such, not passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from tpu_runner.analysis import jaxpr_walk
from tpu_runner.analysis.grid_walk import (
    MANUAL_SPACES,
    block_dim,
    call_name,
    grid_chunks,
    reads_index_operands,
    space_name,
    static_grid,
    vectorised,
)

MAX_BLOCKS = 1 << 26  # output blocks tracked per array; beyond this the check is skipped and said so


@dataclass(frozen=True)
class Coverage:
    missing: tuple[str, ...]  # one line per output with elements never written, naming the region
    unchecked: tuple[str, ...]  # outputs this check cannot see into, and why

    @property
    def complete(self) -> bool:
        return not self.missing


def output_coverage(closed_jaxpr: Any) -> Coverage:
    missing: list[str] = []
    unchecked: list[str] = []
    for eqn in jaxpr_walk.pallas_calls(closed_jaxpr):
        if eqn.primitive.name != "pallas_call":
            unchecked.append(f"{call_name(eqn)}: a mesh kernel writes its outputs itself")
            continue
        gm = eqn.params["grid_mapping"]
        grid, known = static_grid(gm.grid)
        outputs = gm.block_mappings[gm.num_inputs:gm.num_inputs + gm.num_outputs]
        for k, bm in enumerate(outputs):
            label = f"{call_name(eqn)} output {k}"
            space = space_name(bm.transformed_block_aval.memory_space)
            if space in MANUAL_SPACES:
                unchecked.append(f"{label}: in memory space {space}, written by the kernel's own DMAs")
                continue
            if not known:
                unchecked.append(f"{label}: the grid has bounds known only at run time")
                continue
            if reads_index_operands(bm.index_map_jaxpr, len(grid)):
                unchecked.append(f"{label}: its index map reads run-time scalars (scalar prefetch)")
                continue
            problem = _missing_region(bm, grid, label)
            if problem == "too large":
                unchecked.append(f"{label}: more than {MAX_BLOCKS} output blocks to track")
            elif problem:
                missing.append(problem)
    return Coverage(tuple(missing), tuple(unchecked))


def _missing_region(bm: Any, grid: tuple[int, ...], label: str) -> str | None:
    shape = tuple(int(d) for d in bm.array_aval.shape)
    block = tuple(1 if d is None else d for d in (block_dim(d) for d in bm.block_shape))
    counts = tuple(max(1, math.ceil(s / b)) if s else 0 for s, b in zip(shape, block, strict=True))
    total = math.prod(counts)
    if total == 0:
        return None
    if total > MAX_BLOCKS:
        return "too large"
    written = np.zeros(counts, dtype=bool)
    if not grid:  # no grid: one step, at the block its index map gives with no grid indices
        from jax.extend import core as jex_core

        index = tuple(int(i) for i in jex_core.jaxpr_as_fun(bm.index_map_jaxpr)())
        if all(0 <= i < c for i, c in zip(index, counts, strict=True)):
            written[index] = True
    elif math.prod(grid) > 0:
        evaluate = vectorised([bm.index_map_jaxpr], len(grid))
        for chunk in grid_chunks(grid):
            columns = [chunk[:, axis] for axis in range(len(grid))]
            rows = np.asarray(evaluate(*columns)[0]).reshape(len(chunk), -1)
            inside = np.all((rows >= 0) & (rows < np.array(counts)), axis=1)
            written[tuple(rows[inside].T)] = True
    if written.all():
        return None
    absent = np.argwhere(~written)
    first, last = absent.min(axis=0), absent.max(axis=0)
    region = ", ".join(f"{lo * b}:{min((hi + 1) * b, s)}" for lo, hi, b, s in zip(first, last, block, shape,
                                                                                     strict=True))
    return (f"{label} ({bm.array_aval.str_short()}): {len(absent)} of {total} blocks of {list(block)} are never "
            f"written by the grid {list(grid)}, within [{region}]" + ("" if math.prod(grid) else
                                                                       " (the grid has no steps)"))
