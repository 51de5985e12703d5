"""Convolutions in other layouts, as the canonical one between transposes; transposes that undo each other gone.

Code ported from PyTorch often transposes NCHW to NHWC, convolves with dimension numbers such as
`((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))` and transposes back. A convolution with dimension numbers
(lhs, rhs, out) is the NC(spatial) x OI(spatial) -> NC(spatial) convolution of `transpose(image, lhs)` by
`transpose(kernel, rhs)`, its result transposed by the inverse of `out`; written so, the transposes the port added
meet theirs and compose to nothing, and the convolution family sees the convolution it writes. A transposed
convolution written over an explicitly zero-dilated input (a scatter into zeros at strided positions) is read as
the zero pad with interior padding it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from agents.offline.positions import position_value
from agents.offline.program import Arg, Op, Program, Value


def _specs(op: Op) -> tuple[tuple[int, ...], ...] | None:
    dims = op.params.get("dimension_numbers")
    return tuple(tuple(int(d) for d in spec) for spec in dims) if dims is not None else None


def _canonical(dims: Any, rank: int) -> Any:
    order = tuple(range(rank))
    return dims._replace(lhs_spec=order, rhs_spec=order, out_spec=order) if hasattr(dims, "_replace") \
        else (order, order, order)


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


def _dilation_config(program: Program, op: Op) -> tuple[tuple[int, int, int], ...] | None:
    """A scatter of an array into zeros at strided positions (`zeros.at[:, :, ::s, ::s].set(x)`, a transposed
    convolution's zero-dilated input written out) as the lax.pad padding config it is, or None."""
    if op.prim != "scatter" or len(op.args) != 3 or op.params.get("update_jaxpr") is not None:
        return None
    operand, indices, updates = op.args
    zeros = position_value(program, operand)
    if zeros is None or np.any(np.asarray(zeros) != 0) or not isinstance(updates, Value):
        return None
    dims = op.params["dimension_numbers"]
    scattered = tuple(int(d) for d in dims.scatter_dims_to_operand_dims)
    rank = len(op.out.shape)
    if tuple(int(d) for d in dims.inserted_window_dims) != scattered or tuple(dims.operand_batching_dims) \
            or tuple(int(d) for d in dims.update_window_dims) != tuple(a for a in range(rank) if a not in scattered) \
            or len(updates.shape) != rank or list(scattered) != sorted(scattered):
        return None
    where = position_value(program, indices)
    counts = tuple(updates.shape[a] for a in scattered)
    if where is None or np.shape(where) != (*counts, len(scattered)):
        return None
    config = []
    for a in range(rank):
        if a not in scattered:
            if updates.shape[a] != op.out.shape[a]:
                return None
            config.append((0, 0, 0))
            continue
        j = scattered.index(a)
        coordinate = np.asarray(where)[..., j]
        first = int(coordinate.reshape(-1)[0])
        stride = int(np.take(coordinate, 1, axis=j).reshape(-1)[0]) - first if counts[j] > 1 else 1
        grid = np.arange(counts[j]).reshape([-1 if k == j else 1 for k in range(len(counts))])
        last = first + stride * (counts[j] - 1)
        if stride < 1 or first < 0 or last >= op.out.shape[a] or \
                not np.array_equal(coordinate, np.broadcast_to(first + stride * grid, counts)):
            return None
        config.append((first, op.out.shape[a] - 1 - last, stride - 1))
    return tuple(config)


def dilations_as_pads(program: Program) -> Program:
    """Scatters into zeros at strided positions as the zero pads (with interior padding) they are, and the ops
    that only made their zeros and indices gone: the convolution family reads a transposed convolution's dilated
    input through pads."""
    configs = {op.out.id: config for op in program.ops if (config := _dilation_config(program, op)) is not None}
    if not configs:
        return program
    ops = [Op("pad", (op.args[2], 0.0), {"padding_config": configs[op.out.id]}, op.out) if op.out.id in configs
           else op for op in program.ops]
    while True:
        used = {a.id for o in ops for a in o.args if isinstance(a, Value)} | \
            {a.id for a in program.outputs if isinstance(a, Value)}
        kept = [o for o in ops if o.out.id in used]
        if len(kept) == len(ops):
            return replace(program, ops=ops)
        ops = kept


def canonical_convolutions(program: Program) -> Program:
    """The program with every convolution in the canonical layout (see the module's docstring), its dilated
    inputs written as pads (`dilations_as_pads`)."""
    program = dilations_as_pads(program)
    convs = [op for op in program.ops if op.prim == "conv_general_dilated" and _specs(op) is not None
             and _specs(op) != (tuple(range(len(op.out.shape))),) * 3]
    if not convs:
        return program
    ids = [v.id for v in program.inputs] + [op.out.id for op in program.ops + program.prologue] + list(program.draws)
    next_id = [max(ids, default=0)]

    def fresh(shape: tuple[int, ...], dtype: str) -> Value:
        next_id[0] += 1
        return Value(next_id[0], shape, dtype)

    def transpose(arg: Arg, perm: tuple[int, ...], out: Value | None = None) -> tuple[Op, Value]:
        assert isinstance(arg, Value)
        value = out or fresh(tuple(arg.shape[p] for p in perm), arg.dtype)
        return Op("transpose", (arg,), {"permutation": perm}, value), value

    ops: list[Op] = []
    for op in program.ops:
        if op not in convs:
            ops.append(op)
            continue
        lhs_spec, rhs_spec, out_spec = _specs(op)  # type: ignore[misc]
        identity = tuple(range(len(out_spec)))
        operands = []
        for arg, spec in zip(op.args[:2], (lhs_spec, rhs_spec), strict=True):
            if spec != identity:
                to, arg = transpose(arg, spec)
                ops.append(to)
            operands.append(arg)
        canonical = {**op.params, "dimension_numbers": _canonical(op.params["dimension_numbers"], len(out_spec))}
        if out_spec == identity:
            ops.append(Op(op.prim, (*operands, *op.args[2:]), canonical, op.out))
            continue
        result = fresh(tuple(op.out.shape[p] for p in out_spec), op.out.dtype)
        ops.append(Op(op.prim, (*operands, *op.args[2:]), canonical, result))
        ops.append(transpose(result, _inverse(out_spec), op.out)[0])  # the old id: its users read it as before
    return _without_round_trips(replace(program, ops=ops))


def _without_round_trips(program: Program) -> Program:
    """Transposes of transposes composed; identities (and compositions that are) read through; unused dropped."""
    ops = list(program.ops)
    changed = True
    while changed:
        changed = False
        producer = {op.out.id: op for op in ops}
        subst: dict[int, Arg] = {}
        for i, op in enumerate(ops):
            if op.prim != "transpose" or not isinstance(op.args[0], Value):
                continue
            inner = producer.get(op.args[0].id)
            if inner is not None and inner.prim != "transpose":
                inner = None
            if inner is None and tuple(op.params["permutation"]) != tuple(range(len(op.out.shape))):
                continue
            outer = tuple(op.params["permutation"])
            first = tuple(inner.params["permutation"]) if inner else tuple(range(len(outer)))
            composed = tuple(first[p] for p in outer)
            if composed == tuple(range(len(composed))):  # an identity, or a round trip
                subst[op.out.id] = (inner or op).args[0]
            else:
                ops[i] = Op("transpose", inner.args, {"permutation": composed}, op.out)
            changed = True
            break
        if subst:
            ops = [Op(o.prim, tuple(subst.get(a.id, a) if isinstance(a, Value) else a for a in o.args), o.params,
                      o.out) for o in ops if o.out.id not in subst]
            outputs = [subst.get(a.id, a) if isinstance(a, Value) else a for a in program.outputs]
            program = replace(program, outputs=outputs)
        used = {a.id for o in ops for a in o.args if isinstance(a, Value)} | \
            {a.id for a in program.outputs if isinstance(a, Value)}
        kept = [o for o in ops if o.prim != "transpose" or o.out.id in used]
        changed = changed or len(kept) != len(ops)
        ops = kept
    return replace(program, ops=ops)
