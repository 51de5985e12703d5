"""Recognising the triangle update: a dot_general of two rank-3 operands batched over their last axis (the
channel) and contracted over their middle one, each operand a gated projection of one pair input, the result
transposed to [i, j, c], RMS-normalised over the channels, projected and gated.

Matched backwards from the output by products (a projection, its sigmoid gate, a mask or a scale, in any order and
through casts). A program this kernel does not compute - the contraction's operands not projections of one input, a
contraction over unlike axes, an epilogue of another form, mixed dtypes, residues not a whole number of lane
tiles - is left to the other families (None): the matmul family still writes a kernel for its first matmul, which
is better than no kernel. Incoming edges (contracting the first axis) are the same kernel with the contraction's
operands read column blocks at a time.
"""

from __future__ import annotations

from typing import Any

from agents.offline.positions import position_value
from agents.offline.program import CASTS, Op, Program, Value
from agents.offline.triangle.family import Triangle
from agents.offline.triangle.shape import Projection

_REGROUP = ("broadcast_in_dim", "reshape", "expand_dims", "squeeze")


def _made_by(program: Program, value: Any, prim: str) -> Op | None:
    op = program.producer(value) if isinstance(value, Value) else None
    return op if op is not None and op.prim == prim else None


def _factors(program: Program, value: Any) -> list[Any]:
    """The factors of a product, looking through casts."""
    inner = program.behind(value)[0]
    op = _made_by(program, inner, "mul")
    return [f for arg in op.args for f in _factors(program, arg)] if op is not None else [inner]


def _matmul(program: Program, value: Any) -> tuple[Any, int] | None:
    """(lhs, weight input) when `value` is lhs @ W over lhs's last axis, W a [in, out] input."""
    op = _made_by(program, program.behind(value)[0], "dot_general")
    if op is None:
        return None
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    lhs, w = op.args
    weight = program.input_index(w)
    if lb or rb or tuple(rc) != (0,) or not isinstance(lhs, Value) or tuple(lc) != (len(lhs.shape) - 1,) \
            or weight is None or len(program.inputs[weight].shape) != 2:
        return None
    return lhs, weight


def _projection(program: Program, value: Any) -> tuple[int, Projection, int | None] | None:
    """(the pair input, the projection, the mask input) of a product of x @ W, sigmoid(x @ W_gate) and a mask."""
    values, gates, masks = [], [], []
    for factor in _factors(program, value):
        if (found := _matmul(program, factor)) is not None:
            values.append(found)
        elif (gate := _made_by(program, factor, "logistic")) is not None \
                and (found := _matmul(program, gate.args[0])) is not None:
            gates.append(found)
        elif (mask := program.input_index(factor, CASTS + _REGROUP)) is not None:
            masks.append(mask)
        else:
            return None
    if len(values) != 1 or len(gates) > 1 or len(masks) > 1:
        return None
    pairs = {program.input_index(lhs) for lhs, _ in values + gates}
    if len(pairs) != 1 or None in pairs:
        return None
    (x,) = pairs
    return x, Projection(values[0][1], gates[0][1] if gates else None, bool(masks)), masks[0] if masks else None


def _contraction(program: Program) -> Op | None:
    """The dot_general of two rank-3 operands batched over their last axes."""
    for op in program.ops:
        if op.prim != "dot_general" or not all(isinstance(a, Value) and len(a.shape) == 3 for a in op.args):
            continue
        (_, _), (lb, rb) = op.params["dimension_numbers"]
        if tuple(lb) == (2,) and tuple(rb) == (2,):
            return op
    return None


def _rms_normalised(program: Program, value: Any, t: Value) -> tuple[float, int | None] | None:
    """(eps, the scale input) when `value` is t * rsqrt(mean(t^2 over the channels) + eps) [* scale], through
    casts."""
    factors = _factors(program, value)
    plain = [f for f in factors if isinstance(f, Value) and program.behind(f)[0].id == t.id]
    roots = [f for f in factors if _made_by(program, f, "rsqrt") is not None]
    rest = [f for f in factors if not any(f is g for g in plain + roots)]
    if len(plain) != 1 or len(roots) != 1 or len(rest) > 1:
        return None
    scale = None
    if rest:
        scale = program.input_index(rest[0], CASTS + _REGROUP)
        if scale is None or program.inputs[scale].shape != (t.shape[-1],):
            return None
    added = _made_by(program, program.behind(_made_by(program, roots[0], "rsqrt").args[0])[0], "add")
    if added is None:
        return None
    consts = [position_value(program, a) for a in added.args]
    at = [i for i, c in enumerate(consts) if c is not None and c.size == 1]
    if len(at) != 1:
        return None
    eps = float(consts[at[0]].reshape(()))
    mean = program.behind(added.args[1 - at[0]], CASTS + _REGROUP)[0]
    divide = _made_by(program, mean, "div") or _made_by(program, mean, "mul")
    if divide is None:
        return None
    count = position_value(program, divide.args[1])
    if count is None or count.size != 1:
        return None
    count = float(count.reshape(()))
    if abs((count if divide.prim == "div" else 1.0 / count) - t.shape[-1]) > 1e-3 * t.shape[-1]:
        return None
    summed = _made_by(program, program.behind(divide.args[0], CASTS + _REGROUP)[0], "reduce_sum")
    if summed is None or tuple(summed.params["axes"]) != (len(t.shape) - 1,):
        return None
    square = program.behind(summed.args[0])[0]
    op = program.producer(square) if isinstance(square, Value) else None
    if op is None or not (op.prim == "square" or (op.prim == "integer_pow" and op.params.get("y") == 2)
                          or (op.prim == "mul" and op.args[0] == op.args[1])):
        return None
    if program.behind(op.args[0])[0].id != t.id:  # type: ignore[union-attr]
        return None
    return eps, scale


def recognise_triangle(program: Program, output: Value) -> Triangle | None:
    dot = _contraction(program)
    if dot is None:
        return None
    operands = [_projection(program, a) for a in dot.args]
    if any(o is None for o in operands) or len({o[0] for o in operands if o is not None}) != 1:
        return None
    (x, lhs, mask_l), (_, rhs, mask_r) = operands  # type: ignore[misc]
    users = program.users(dot.out)
    if len(users) != 1 or users[0].prim != "transpose":
        return None
    perm = tuple(users[0].params["permutation"])
    if perm not in ((1, 2, 0), (2, 1, 0)):
        return None
    (lc, rc), _ = dot.params["dimension_numbers"]
    pair = program.inputs[x]
    if tuple(lc) != tuple(rc) or tuple(lc) not in ((0,), (1,)):
        return None  # unlike axes: not an update this kernel computes
    t = users[0].out
    # The transposed product's first axis is the free axis of the dot's lhs when the permutation keeps it first.
    left, right = (lhs, rhs) if perm == (1, 2, 0) else (rhs, lhs)
    masks = {m for m in (mask_l, mask_r) if m is not None}
    # The output: (normalised t) @ W_out times sigmoid(x @ W_gate).
    values, gates = [], []
    for factor in _factors(program, output):
        if (found := _matmul(program, factor)) is not None:
            values.append(found)
        elif (gate := _made_by(program, factor, "logistic")) is not None \
                and (found := _matmul(program, gate.args[0])) is not None and program.input_index(found[0]) == x:
            gates.append(found)
        else:
            return None
    if len(values) != 1 or len(gates) > 1:
        return None
    normed = _rms_normalised(program, values[0][0], t)
    if normed is None:
        return None
    eps, scale = normed
    n, _, c_in = pair.shape if len(pair.shape) == 3 else (0, 0, 0)
    if len(pair.shape) != 3 or pair.shape[0] != pair.shape[1] or len(masks) > 1:
        return None
    if masks and program.inputs[next(iter(masks))].shape not in ((n, n, 1), (n, n)):
        return None
    dtypes = {pair.dtype, dot.out.dtype, output.dtype} | {program.inputs[w].dtype for w in
                                                         (left.value, right.value, values[0][1])}
    channels, c_out = t.shape[-1], output.shape[-1]
    # One dtype throughout, residues a whole number of lane tiles, channels whole packed sublane tiles: the
    # kernel's layouts. Otherwise the matmul family still writes the first projection.
    if len(dtypes) != 1 or n % 128 or channels % 16:
        return None
    return Triangle(x=x, mask=next(iter(masks)) if masks else None, left=left, right=right, scale=scale,
                    out=Projection(values[0][1], gates[0][1] if gates else None, False), residues=n, c_in=c_in,
                    channels=channels, c_out=c_out, incoming=tuple(lc) == (0,), eps=eps, dtype=pair.dtype,
                    out_dtype=output.dtype, n_inputs=len(program.inputs), n_static=len(program.static))
