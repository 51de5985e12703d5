"""A `pallas_call`'s grid and BlockSpecs read as numbers: the grid, block shapes and memory spaces, and the block
index each operand's index map gives at every grid step (evaluated vectorised, in chunks, on the CPU). Both the
traffic count (`traffic`) and the coverage check (`coverage`) walk grids with these."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np

MAX_CHUNK_STEPS = 1 << 20  # grid steps evaluated per vectorised index-map call
MANUAL_SPACES = frozenset({"any", "hbm"})


def static_grid(grid: Sequence[Any]) -> tuple[tuple[int, ...], bool]:
    """The grid as ints; a dynamic bound (known only at run time) counts as 1 and makes the figure inexact."""
    if all(isinstance(d, int) for d in grid):
        return tuple(grid), True
    return tuple(d if isinstance(d, int) else 1 for d in grid), False


def block_dim(dim: Any) -> int | None:
    """One block dimension as an int, None when squeezed. jax 0.12 canonicalises BlockSpec entries to
    `Blocked(block_size)`, `Squeezed()`, `Element(block_size, padding)`, `BoundedSlice(..)`, `Indirect(..)`.
    """
    if dim is None or type(dim).__name__ == "Squeezed":
        return None
    return int(getattr(dim, "block_size", dim))


def space_name(memory_space: Any) -> str:
    """'any', 'default', 'vmem', 'smem', 'hbm', 'semaphore_mem', ... for Pallas' and Pallas TPU's enums."""
    if memory_space is None:
        return "default"
    value = getattr(memory_space, "value", None)
    name = value if isinstance(value, str) else str(memory_space)
    return name.split("@")[0].lower()  # a CoreMemorySpace prints as "vmem@core_type"


def call_name(eqn: Any) -> str:
    name = eqn.params.get("name")
    if name:
        return str(name)
    legacy = eqn.params.get("name_and_src_info")  # jax < 0.5
    if legacy is not None:
        return str(legacy.name)
    body = eqn.params.get("jaxpr") or next(iter(eqn.params.get("jaxprs", ())), None)  # mesh kernels: "jaxprs"
    debug_info = getattr(body, "debug_info", None)
    return debug_info.func_name if debug_info is not None else eqn.primitive.name



def block_runs(index_maps: Sequence[Any], grid: tuple[int, ...], n_grid: int) -> tuple[list[int], bool]:
    """Runs of equal consecutive block indices of each index map over the grid, and whether all are exact."""
    steps = math.prod(grid)
    runs = [0] * len(index_maps)
    exact = True
    to_evaluate: list[int] = []
    for i, index_map in enumerate(index_maps):
        if steps <= 1:
            runs[i] = steps
        elif (projected := projection_runs(index_map, grid, n_grid)) is not None:
            runs[i] = projected
        elif reads_index_operands(index_map, n_grid):
            runs[i], exact = steps, False  # block indices depend on run-time scalars: an upper bound
        else:
            to_evaluate.append(i)
    if to_evaluate:
        try:
            counted = evaluated_runs([index_maps[i] for i in to_evaluate], grid, n_grid)
        except Exception:  # an index map this host cannot evaluate: fall back to the upper bound
            counted, exact = [steps] * len(to_evaluate), False
        for i, n in zip(to_evaluate, counted, strict=True):
            runs[i] = n
    return runs, exact


def projection_runs(index_map: Any, grid: tuple[int, ...], n_grid: int) -> int | None:
    """Closed form when every block index is a grid index or a constant, as in most kernels.

    Steps t and t+1 differ exactly in the axes from the slowest one that increments onwards (axes of size 1
    never change), so the block index changes iff that axis is at or before m, the last axis the map reads
    with size > 1: the runs are the distinct prefixes (i_0, ..., i_m), prod(grid[:m + 1]) of them.
    """
    jaxpr = getattr(index_map, "jaxpr", index_map)
    position = {var: axis for axis, var in enumerate(jaxpr.invars[:n_grid])}
    read: list[int] = []
    for out in jaxpr.outvars:
        if isinstance(out, jex.core.Literal):
            continue
        if out not in position:
            return None
        read.append(position[out])
    changing = [axis for axis in read if grid[axis] > 1]
    return math.prod(grid[: max(changing) + 1]) if changing else 1


def reads_index_operands(index_map: Any, n_grid: int) -> bool:
    jaxpr = getattr(index_map, "jaxpr", index_map)
    scalars = set(jaxpr.invars[n_grid:])
    used = {v for eqn in jaxpr.eqns for v in eqn.invars if not isinstance(v, jex.core.Literal)}
    used |= {v for v in jaxpr.outvars if not isinstance(v, jex.core.Literal)}
    return bool(scalars & used)


def evaluated_runs(index_maps: Sequence[Any], grid: tuple[int, ...], n_grid: int) -> list[int]:
    """Evaluate the maps over the whole grid, vectorised in chunks on the CPU, and count index changes."""
    evaluate = vectorised(index_maps, n_grid)
    device = cpu_device()
    runs = [0] * len(index_maps)
    last: list[np.ndarray | None] = [None] * len(index_maps)
    for chunk in grid_chunks(grid):
        columns = [jax.device_put(chunk[:, axis], device) for axis in range(n_grid)]
        for i, rows in enumerate(evaluate(*columns)):
            rows = np.asarray(rows).reshape(len(chunk), -1)
            changed = np.any(rows[1:] != rows[:-1], axis=1)
            starts_new = last[i] is None or bool(np.any(rows[0] != last[i]))
            runs[i] += int(changed.sum()) + int(starts_new)
            last[i] = rows[-1]
    return runs


def vectorised(index_maps: Sequence[Any], n_grid: int) -> Callable[..., list[Any]]:
    def one_step(*grid_indices: Any) -> list[Any]:
        blocks = []
        for index_map in index_maps:
            # The scalar-prefetch refs are not read (checked before): any placeholder will do.
            placeholders = [np.zeros(aval.shape, aval.dtype) for aval in index_map.in_avals[n_grid:]]
            outs = jex.core.jaxpr_as_fun(index_map)(*grid_indices, *placeholders)
            ints = [jnp.asarray(o, jnp.int32) for o in outs]
            blocks.append(jnp.stack(ints) if ints else jnp.zeros(0, jnp.int32))  # [n_block_dims]
        return blocks

    return jax.jit(jax.vmap(one_step))


def grid_chunks(grid: tuple[int, ...]) -> Iterator[np.ndarray]:
    """Grid indices in pipeline order (row-major, last axis fastest): int32 arrays [n, len(grid)]."""
    steps = math.prod(grid)
    if not grid:
        yield np.zeros((1, 0), np.int32)
        return
    for start in range(0, steps, MAX_CHUNK_STEPS):
        flat = np.arange(start, min(start + MAX_CHUNK_STEPS, steps), dtype=np.int64)
        yield np.stack(np.unravel_index(flat, grid), axis=1).astype(np.int32)


def cpu_device() -> Any:
    try:
        return jax.devices("cpu")[0]
    except RuntimeError:  # the CPU platform was left out of JAX_PLATFORMS
        return jax.devices()[0]
