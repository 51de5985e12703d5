"""Row-wise programs whose rows are not the last axis, rewritten so that they are and the row-wise family's code
applies:
- reductions over one axis other than the last (a sum over dim 1, a softmax or RMS norm over NCHW's channels):
  that axis moved last (`with_axis_last`); the kernel reads blocks of the original layout, (reduced axis, positions
  after it), and transposes them in VMEM;
- reductions over several trailing axes (an instance norm over H and W): those axes merged into one
  (`with_trailing_merged`), which is the same array in memory.

Pure: the program in, the rewritten program (the same value ids; shapes and axis parameters rewritten) out, or None
where an op would need more than the rewrite (a reshape that merges other axes, a transpose, a matmul)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from agents.offline.expr import REDUCE
from agents.offline.program import Op, Program, Value

# Reductions whose `axes` say which axis a program reduces over.
_REDUCING = frozenset(REDUCE) | {"argmax", "argmin", "reduce_prod"}
# Ops whose parameters name no axis and whose operands are the result's shape or scalars.
_PLAIN_PARAMS = frozenset({"convert_element_type", "integer_pow", "select_n", "clamp", "copy", "copy_p",
                           "custom_jvp_call", "pjit", "stop_gradient", "reduce_precision", "is_finite"})


def _reduced_axes(program: Program, main: tuple[int, ...]) -> tuple[int, ...] | None:
    """The axes every reduction over a whole-rank value of `main` reduces, when they all reduce the same ones."""
    axes = {tuple(sorted(op.params.get("axes", ()))) for op in program.ops
            if op.prim in _REDUCING and isinstance(op.args[0], Value) and len(op.args[0].shape) == len(main)}
    return axes.pop() if len(axes) == 1 else None


def reduced_axis(program: Program, main: tuple[int, ...]) -> int | None:
    """The one axis, not the last, that every reduction over a whole-rank value of `main` reduces; None otherwise."""
    axes = _reduced_axes(program, main)
    return axes[0] if axes is not None and len(axes) == 1 and axes[0] != len(main) - 1 else None


def trailing_axes(program: Program, main: tuple[int, ...]) -> int | None:
    """The first of the trailing axes (two or more) every reduction over a whole-rank value reduces; None otherwise."""
    axes = _reduced_axes(program, main)
    if axes is None or len(axes) < 2 or axes != tuple(range(len(main) - len(axes), len(main))):
        return None
    return axes[0]


def with_trailing_merged(program: Program, main: tuple[int, ...], first: int) -> Program | None:
    """`program` with the axes from `first` on merged into one, in whole-rank values (their trailing sizes all
    `main`'s or all 1) and in values of exactly those sizes (a per-position weight); None where that is not all."""
    rank, tail = len(main), main[first:]
    size = math.prod(tail)

    def value(v: Value) -> Value:
        if len(v.shape) == rank and v.shape[first:] == tail:
            return replace(v, shape=v.shape[:first] + (size,))
        if len(v.shape) == rank and all(n == 1 for n in v.shape[first:]):
            return replace(v, shape=v.shape[:first] + (1,))
        if len(v.shape) == rank:
            raise _NotMerged
        return replace(v, shape=(size,)) if v.shape == tail else v

    def arg(a: Any) -> Any:
        return value(a) if isinstance(a, Value) else a

    ops: list[Op] = []
    try:
        for op in program.ops:
            params = _merged_params(op, rank, first, tail, value)
            if params is None:
                return None
            ops.append(Op(op.prim, tuple(arg(a) for a in op.args), params, value(op.out)))
        return replace(program, inputs=[value(v) for v in program.inputs], ops=ops,
                       outputs=[arg(o) for o in program.outputs])
    except _NotMerged:
        return None


class _NotMerged(Exception):
    """A value whose trailing axes are neither all the merged sizes nor all 1."""


def _merged_params(op: Op, rank: int, first: int, tail: tuple[int, ...], value: Any) -> dict[str, Any] | None:
    """The op's parameters with the trailing axes from `first` merged, or None where the merge does not describe it."""
    shapes = [a.shape for a in op.args if isinstance(a, Value)]
    in_rank = len(shapes[0]) if shapes else 0
    params = dict(op.params)
    if op.prim in _REDUCING:
        if in_rank == rank:
            params["axes"] = (first,)
        return params
    if op.prim == "broadcast_in_dim":
        if len(op.out.shape) != rank:
            return params if in_rank != rank else None
        dims = tuple(op.params["broadcast_dimensions"])
        if in_rank == rank and dims == tuple(range(rank)):
            moved = tuple(range(first + 1))
        elif all(d < first for d in dims):  # a per-row value (a reduction's result) or a scalar
            moved = dims
        elif shapes and shapes[0] == tail and dims == tuple(range(first, rank)):  # a per-position value
            moved = (first,)
        else:
            return None
        params["shape"], params["broadcast_dimensions"] = value(op.out).shape, moved
        return params
    if op.prim == "reshape":  # one that adds or drops unit axes only
        before, after = value(op.args[0]).shape, value(op.out).shape
        if op.params.get("dimensions") is not None or [n for n in before if n != 1] != [n for n in after if n != 1]:
            return None
        params["new_sizes"] = after
        return params
    if op.prim == "squeeze":  # of a value the merge leaves alone (a weight's element taken as a scalar)
        return params if in_rank != rank and value(op.args[0]).shape == op.args[0].shape else None
    return _elementwise(op, shapes, params)


def with_axis_last(program: Program, main: tuple[int, ...], axis: int) -> Program | None:
    """`program` with `axis` of its whole-rank values moved last; None where an op is more than its permutation."""
    rank = len(main)
    order = [d for d in range(rank) if d != axis] + [axis]
    where = {d: order.index(d) for d in range(rank)}

    def value(v: Value) -> Value:
        return replace(v, shape=tuple(v.shape[d] for d in order)) if len(v.shape) == rank else v

    def arg(a: Any) -> Any:
        return value(a) if isinstance(a, Value) else a

    ops: list[Op] = []
    for op in program.ops:
        params = _params(op, rank, where, value)
        if params is None:
            return None
        ops.append(Op(op.prim, tuple(arg(a) for a in op.args), params, value(op.out)))
    return replace(program, inputs=[value(v) for v in program.inputs], ops=ops,
                   outputs=[arg(o) for o in program.outputs])


def _params(op: Op, rank: int, where: dict[int, int], value: Any) -> dict[str, Any] | None:
    """The op's parameters in the permuted axes, or None where a permutation does not describe it."""
    shapes = [a.shape for a in op.args if isinstance(a, Value)]
    in_rank = len(shapes[0]) if shapes else 0
    params = dict(op.params)
    if op.prim in _REDUCING:
        if in_rank == rank:
            params["axes"] = tuple(sorted(where[a] for a in op.params["axes"]))
        return params
    if op.prim == "broadcast_in_dim":
        if len(op.out.shape) != rank:
            return params if in_rank != rank else None
        dims = tuple(op.params["broadcast_dimensions"])
        moved = tuple(range(rank)) if in_rank == rank else tuple(where[d] for d in dims)
        if in_rank == rank and dims != tuple(range(rank)) or list(moved) != sorted(moved):
            return None
        params["shape"], params["broadcast_dimensions"] = value(op.out).shape, moved
        return params
    if op.prim == "reshape":  # only one that adds or drops unit axes keeps its meaning under the permutation
        before, after = value(op.args[0]).shape, value(op.out).shape
        if op.params.get("dimensions") is not None or [n for n in before if n != 1] != [n for n in after if n != 1]:
            return None
        params["new_sizes"] = after
        return params
    if op.prim == "squeeze":
        if in_rank == rank:
            params["dimensions"] = tuple(sorted(where[d] for d in op.params["dimensions"]))
        return params
    return _elementwise(op, shapes, params)


def _elementwise(op: Op, shapes: list[tuple[int, ...]], params: dict[str, Any]) -> dict[str, Any] | None:
    """The parameters of an op computed per element (size-1 axes broadcast: a row's max kept as (n, 1, h, w)
    against (n, c, h, w)) that names no axis; None for any other op."""
    out = op.out.shape
    elementwise = all(not s or (len(s) == len(out) and all(a in (b, 1) for a, b in zip(s, out, strict=True)))
                      for s in shapes)
    return params if elementwise and (op.prim in _PLAIN_PARAMS or not _names_an_axis(op.params)) else None


def _names_an_axis(params: dict[str, Any]) -> bool:
    return any(key in params for key in ("axes", "axis", "dimensions", "dimension", "permutation",
                                         "broadcast_dimensions", "start_indices", "new_sizes"))
