"""A row-wise program that reduces over an axis other than the last (a sum over dim 1, a softmax over NCHW's
channels, an RMS norm over them) rewritten with that axis last, so the row-wise family's code applies: the kernel
reads blocks of the original layout, (reduced axis, positions after it), and transposes them in VMEM.

Pure: the program in, the rewritten program (the same value ids, shapes and axis parameters permuted) out, or None
where an op would need more than a permutation (a reshape that merges axes, a transpose, a matmul)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agents.offline.expr import REDUCE
from agents.offline.program import Op, Program, Value

# Reductions whose `axes` say which axis a program reduces over.
_REDUCING = frozenset(REDUCE) | {"argmax", "argmin", "reduce_prod"}
# Ops whose parameters name no axis and whose operands are the result's shape or scalars.
_PLAIN_PARAMS = frozenset({"convert_element_type", "integer_pow", "select_n", "clamp", "copy", "copy_p",
                           "custom_jvp_call", "pjit", "stop_gradient", "reduce_precision", "is_finite"})


def reduced_axis(program: Program, main: tuple[int, ...]) -> int | None:
    """The one axis, not the last, that every reduction over a whole-rank value of `main` reduces; None otherwise."""
    axes = {tuple(op.params.get("axes", ())) for op in program.ops
            if op.prim in _REDUCING and isinstance(op.args[0], Value) and len(op.args[0].shape) == len(main)}
    if len(axes) != 1:
        return None
    (only,) = axes
    return only[0] if len(only) == 1 and only[0] != len(main) - 1 else None


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
    # Per element, with size-1 axes broadcast (a row's max kept as (n, 1, h, w) against (n, c, h, w)).
    out = op.out.shape
    elementwise = all(not s or (len(s) == len(out) and all(a in (b, 1) for a, b in zip(s, out, strict=True)))
                      for s in shapes)
    return params if elementwise and (op.prim in _PLAIN_PARAMS or not _names_an_axis(op.params)) else None


def _names_an_axis(params: dict[str, Any]) -> bool:
    return any(key in params for key in ("axes", "axis", "dimensions", "dimension", "permutation",
                                         "broadcast_dimensions", "start_indices", "new_sizes"))
