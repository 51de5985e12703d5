"""Row-wise programs whose rows are not the last axis, rewritten so that they are and the row-wise family's code
applies (`rows_last`):
- reductions over one axis other than the last (a sum over dim 1, a softmax or RMS norm over NCHW's channels):
  that axis moved last; the kernel reads blocks of the original layout, (reduced axis, positions after it), and
  transposes them in VMEM;
- reductions over several trailing axes (an instance norm over H and W): those axes merged into one, which is the
  same array in memory.

Pure: the program in, the rewritten program (the same value ids; shapes and axis parameters rewritten) out, or None
where an op would need more than the rewrite (a reshape that merges other axes, a transpose, a matmul)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from agents.offline.expr import REDUCE
from agents.offline.program import Op, Program, Value

# Reductions whose `axes` say which axis a program reduces over.
_REDUCING = frozenset(REDUCE) | {"argmax", "argmin", "reduce_prod"}
# Ops whose parameters name no axis and whose operands are the result's shape or scalars.
_PLAIN_PARAMS = frozenset({"convert_element_type", "integer_pow", "select_n", "clamp", "copy", "copy_p",
                           "custom_jvp_call", "pjit", "stop_gradient", "reduce_precision", "is_finite"})

ValueMap = Callable[[Value], Value]


@dataclass(frozen=True)
class Rows:
    """A program rewritten with its rows last: its main shape, and how the reference's layout maps to it."""

    program: Program
    main: tuple[int, ...]
    moved_axis: int | None = None  # the reference's axis moved last
    merged_from: int | None = None  # the first of the reference's trailing axes merged into one


class _NotRewritten(Exception):
    """A value the rewrite cannot describe (trailing axes neither all the merged sizes nor all 1)."""


def rows_last(program: Program, main: tuple[int, ...]) -> Rows | None:
    """`program` rewritten so that every reduction over a whole-rank value of `main` reduces its last axis, where
    they all reduce one other axis or the same trailing axes; None where that is not so or the rewrite fails."""
    axes = {tuple(sorted(op.params.get("axes", ()))) for op in program.ops
            if op.prim in _REDUCING and isinstance(op.args[0], Value) and len(op.args[0].shape) == len(main)}
    if len(axes) != 1:
        return None
    (reduced,) = axes
    rank = len(main)
    if len(reduced) == 1 and reduced[0] != rank - 1:
        return _moved(program, main, reduced[0])
    if len(reduced) >= 2 and reduced == tuple(range(rank - len(reduced), rank)):
        return _merged(program, main, reduced[0])
    return None


def _rewritten(program: Program, value: ValueMap, params_of: Callable[[Op], dict[str, Any] | None]
               ) -> Program | None:
    """`program` with every value mapped by `value` and every op's parameters by `params_of` (None: not
    rewritable)."""
    def arg(a: Any) -> Any:
        return value(a) if isinstance(a, Value) else a

    ops: list[Op] = []
    try:
        for op in program.ops:
            params = params_of(op)
            if params is None:
                return None
            ops.append(Op(op.prim, tuple(arg(a) for a in op.args), params, value(op.out)))
        return replace(program, inputs=[value(v) for v in program.inputs], ops=ops,
                       outputs=[arg(o) for o in program.outputs])
    except _NotRewritten:
        return None


def _moved(program: Program, main: tuple[int, ...], axis: int) -> Rows | None:
    """`axis` of the whole-rank values moved last."""
    rank = len(main)
    order = [d for d in range(rank) if d != axis] + [axis]
    where = {d: order.index(d) for d in range(rank)}

    def value(v: Value) -> Value:
        return replace(v, shape=tuple(v.shape[d] for d in order)) if len(v.shape) == rank else v

    def params_of(op: Op) -> dict[str, Any] | None:
        shapes, in_rank, params = _operands(op)
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
        if op.prim == "squeeze":
            if in_rank == rank:
                params["dimensions"] = tuple(sorted(where[d] for d in op.params["dimensions"]))
            return params
        return _unit_reshape(op, value, params) if op.prim == "reshape" else _elementwise(op, shapes, params)

    rewritten = _rewritten(program, value, params_of)
    return None if rewritten is None else Rows(rewritten, tuple(main[d] for d in order), moved_axis=axis)


def _merged(program: Program, main: tuple[int, ...], first: int) -> Rows | None:
    """The axes from `first` on merged into one, in whole-rank values (their trailing sizes all `main`'s or all 1)
    and in values of exactly those sizes (a per-position weight)."""
    rank, tail = len(main), main[first:]
    size = math.prod(tail)

    def value(v: Value) -> Value:
        if len(v.shape) == rank and v.shape[first:] == tail:
            return replace(v, shape=v.shape[:first] + (size,))
        if len(v.shape) == rank and all(n == 1 for n in v.shape[first:]):
            return replace(v, shape=v.shape[:first] + (1,))
        if len(v.shape) == rank:
            raise _NotRewritten
        return replace(v, shape=(size,)) if v.shape == tail else v

    def params_of(op: Op) -> dict[str, Any] | None:
        shapes, in_rank, params = _operands(op)
        if op.prim in _REDUCING:
            if in_rank == rank:
                params["axes"] = (first,)
            return params
        if op.prim == "broadcast_in_dim":
            if len(op.out.shape) != rank:
                return params if in_rank != rank else None
            dims = tuple(op.params["broadcast_dimensions"])
            if in_rank == rank and dims == tuple(range(rank)):
                merged = tuple(range(first + 1))
            elif all(d < first for d in dims):  # a per-row value (a reduction's result) or a scalar
                merged = dims
            elif shapes and shapes[0] == tail and dims == tuple(range(first, rank)):  # a per-position value
                merged = (first,)
            else:
                return None
            params["shape"], params["broadcast_dimensions"] = value(op.out).shape, merged
            return params
        if op.prim == "squeeze":  # of a value the merge leaves alone (a weight's element taken as a scalar)
            return params if in_rank != rank and value(op.args[0]).shape == op.args[0].shape else None
        return _unit_reshape(op, value, params) if op.prim == "reshape" else _elementwise(op, shapes, params)

    rewritten = _rewritten(program, value, params_of)
    return None if rewritten is None else Rows(rewritten, main[:first] + (size,), merged_from=first)


def _operands(op: Op) -> tuple[list[tuple[int, ...]], int, dict[str, Any]]:
    """The shapes of the op's array operands, the first one's rank, and a copy of its parameters to rewrite."""
    shapes = [a.shape for a in op.args if isinstance(a, Value)]
    return shapes, len(shapes[0]) if shapes else 0, dict(op.params)


def _unit_reshape(op: Op, value: ValueMap, params: dict[str, Any]) -> dict[str, Any] | None:
    """A reshape that only adds or drops unit axes keeps its meaning under either rewrite; another does not."""
    before, after = value(op.args[0]).shape, value(op.out).shape
    if op.params.get("dimensions") is not None or [n for n in before if n != 1] != [n for n in after if n != 1]:
        return None
    params["new_sizes"] = after
    return params


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
