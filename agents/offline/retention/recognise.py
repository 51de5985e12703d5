"""Recognising retention: two chained matmuls whose scores are weighted by a decay made from positions and divided
by their rows' absolute sums, with no softmax between them.

By structure, the ops between the two matmuls are matched one by one; by numbers, the decay is evaluated from the
program's positions with numpy (agents.offline.positions): its mask must keep the keys at or before each query, its
exponent must be a per-head rate times the query-minus-key distance. A program of this kind that the kernel cannot
serve gets a NotRecognised that says what differs; one of another kind gets None (the next family is tried).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.offline.expr import NotRecognised
from agents.offline.positions import causal_mismatch, is_zero, position_value
from agents.offline.program import CASTS, Op, Program, Value
from agents.offline.retention.family import Retention
from agents.offline.retention.shape import MAX_EXPONENT

_REGROUP = ("broadcast_in_dim", "reshape", "expand_dims", "squeeze")


def _only_user(program: Program, value: Value, what: str) -> Op:
    users = program.users(value)
    if len(users) != 1:
        raise NotRecognised(f"retention's {what} is used {len(users)} times; the offline brain follows one chain")
    return users[0]


def _through(program: Program, value: Value, prims: tuple[str, ...]) -> tuple[Value, list[Op]]:
    """Follow `value` forward through single-use ops of `prims`; the value reached and the ops passed."""
    passed = []
    while True:
        users = program.users(value)
        if len(users) != 1 or users[0].prim not in prims:
            return value, passed
        passed.append(users[0])
        value = users[0].out


def _input_behind(program: Program, arg: Any, what: str) -> Value:
    """The program input a matmul operand is, looking through casts."""
    if (index := program.input_index(arg)) is not None:
        return program.inputs[index]
    raise NotRecognised(f"retention's {what} is computed inside the reference; the offline brain reads q, k and v "
                        "as inputs")


def _lift(value: np.ndarray, ops: list[Op]) -> np.ndarray:
    """A broadcastable numpy value carried through broadcasts and casts (unit axes where the program broadcasts)."""
    for op in ops:
        if op.prim == "broadcast_in_dim":
            unit = [1] * len(op.out.shape)
            for i, d in enumerate(op.params["broadcast_dimensions"]):
                unit[d] = value.shape[i]
            value = value.reshape(unit)
        elif op.prim in ("reshape", "expand_dims", "squeeze"):
            if value.size != 1 and value.shape != op.args[0].shape:  # type: ignore[union-attr]
                raise NotRecognised("retention's decay is reshaped on its way to the scores")
            value = value.reshape(op.out.shape) if value.size != 1 else value.reshape((1,) * len(op.out.shape))
    return value


def _peeled(program: Program, value: Any) -> tuple[Any, list[Op]]:
    """`value` traced back through casts and regroupings, and the ops passed (outermost last, as `_lift` applies
    them)."""
    inner, passed = program.behind(value, CASTS + _REGROUP)
    return inner, passed[::-1]


def _masked(program: Program, decay: Value) -> tuple[np.ndarray, Any, Op]:
    """Where the decay is kept (a where() between zero and the growth, or the growth times a 0/1 mask), the
    growth, and the op that masks it."""
    inner, _ = _peeled(program, decay)
    op = program.producer(inner) if isinstance(inner, Value) else None
    if op is not None and op.prim == "select_n" and len(op.args) == 3:
        predicate, if_false, if_true = op.args
        if is_zero(program, if_false) or is_zero(program, if_true):
            mask = position_value(program, predicate)
            if mask is None:
                raise NotRecognised("retention's decay mask is not made from positions alone (or is too large to "
                                    "check)")
            kept_when = is_zero(program, if_false)
            return (mask.astype(bool) if kept_when else ~mask.astype(bool)), (if_true if kept_when else if_false), op
    if op is not None and op.prim == "mul" and len(op.args) == 2:
        values = [position_value(program, a) for a in op.args]
        for mask, growth in ((values[0], op.args[1]), (values[1], op.args[0])):
            if mask is not None and bool(np.all((mask == 0) | (mask == 1))):
                return mask.astype(bool), growth, op
    raise NotRecognised("retention's decay is not masked to zero after each query (a where() or a 0/1 mask from "
                        "positions); the offline brain writes exp(rate x (query - key)) decays, zero after the query")


def _exponent(program: Program, growth: Any) -> tuple[np.ndarray, np.ndarray]:
    """The decay's rate and the distance it is raised by, as written: exp(rate x distance) or gamma ** distance
    (rate = log gamma), each broadcastable over the growth's axes."""
    inner, chain = _peeled(program, growth)
    op = program.producer(inner) if isinstance(inner, Value) else None
    if op is not None and op.prim == "exp":
        product, _ = _peeled(program, op.args[0])
        mul = program.producer(product) if isinstance(product, Value) else None
        if mul is None or mul.prim != "mul" or len(mul.args) != 2:
            raise NotRecognised("retention's decay exponent is not a rate times a distance")
        parts = [position_value(program, a) for a in mul.args]
    elif op is not None and op.prim == "pow" and len(op.args) == 2:
        parts = [position_value(program, a) for a in op.args]
        if parts[0] is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                parts[0] = np.log(parts[0].astype(np.float32))
    else:
        raise NotRecognised("retention's decay is not an exponential of the distance (exp(rate x (query - key)) or "
                            "gamma ** (query - key))")
    if any(p is None for p in parts):
        raise NotRecognised("retention's decay exponent is not made from positions and constants alone")
    rank = len(op.out.shape)
    a, b = (x.reshape((1,) * (rank - x.ndim) + x.shape) for x in parts if x is not None)
    rate, distance = (a, b) if a.shape[-2:] == (1, 1) else (b, a)
    if rate.shape[-2:] != (1, 1):
        raise NotRecognised("retention's decay rate varies along the query or key axis (a rate per head only)")
    if not np.all(np.isfinite(rate)):
        raise NotRecognised("retention's decay base is not positive (no real rate)")
    return _lift(rate, chain), _lift(distance, chain)


def _decay_parts(program: Program, decay: Value) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The decay's mask (where it is not zero), the per-head rate and the distance it raises it to, each as a
    broadcastable array over the decay's own axes."""
    _, chain = _peeled(program, decay)
    kept, growth, mask_op = _masked(program, decay)
    rate, distance = _exponent(program, growth)
    rank = len(mask_op.out.shape)
    kept, rate, distance = (x.reshape((1,) * (rank - x.ndim) + x.shape) for x in (kept, rate, distance))
    return _lift(kept, chain), _lift(rate, chain), _lift(distance, chain)


def _rates(program: Program, decay: Value, batch_dims: tuple[int, ...], seq: int
           ) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """The decay's rates over the batch axes they vary along (row-major) and that shape (1 where they do not
    vary), after checking the mask is causal and the distance is the query's position minus the key's."""
    kept, rate, distance = _decay_parts(program, decay)
    rank = len(batch_dims) + 2
    kept, rate, distance = (x.reshape((1,) * (rank - x.ndim) + x.shape) for x in (kept, rate, distance))
    for name, x in (("mask", kept), ("distance", distance)):
        if any(size != 1 for size in x.shape[:-2]):
            raise NotRecognised(f"retention's decay {name} differs between heads or batch entries")
    plane = kept.reshape(kept.shape[-2:])
    mismatch = causal_mismatch(plane, (seq, seq), 0, 1) if plane.shape != (1, 1) else "no mask"
    if mismatch is not None:
        raise NotRecognised(f"retention's decay keeps {mismatch}; the offline brain writes causal decays (each "
                            "query sees the keys at or before it)")
    plane = np.broadcast_to(distance.reshape(distance.shape[-2:]), (seq, seq)).astype(np.float64)
    steps = (np.arange(seq)[:, None] - np.arange(seq)[None, :]).astype(np.float64)
    causal = steps >= 0
    if np.array_equal(plane[causal], steps[causal]):
        sign = 1.0
    elif np.array_equal(plane[causal], -steps[causal]):
        sign = -1.0
    else:
        raise NotRecognised("retention's decay exponent is not a rate times the query-minus-key distance")
    table = rate.reshape(rate.shape[:-2])
    if any(size not in (1, full) for size, full in zip(table.shape, batch_dims, strict=True)):
        raise NotRecognised("retention's decay rates do not broadcast over its batch and heads")
    per_index = table.reshape(-1).astype(np.float32) * sign
    if float(per_index.max(initial=-np.inf)) > 0.0:
        raise NotRecognised("retention's rates grow with distance (a rate above zero); the offline brain writes "
                            "decays")
    if float(np.abs(per_index).max(initial=0.0)) * 128 > MAX_EXPONENT:
        raise NotRecognised(f"retention decays by more than exp(-{MAX_EXPONENT:g}) over 128 positions; the kernel's "
                            "factored decay would underflow")
    return tuple(float(r) for r in per_index), tuple(table.shape)


def _floor(program: Program, total: Value) -> tuple[float, Value]:
    """The rows' floor (max(sum, eps)) after their absolute sum, and the value the scores are divided by."""
    reached, _ = _through(program, total, _REGROUP + CASTS)
    users = program.users(reached)
    if len(users) == 1 and users[0].prim == "max":
        op = users[0]
        others = [a for a in op.args if not (isinstance(a, Value) and a.id == reached.id)]
        eps = position_value(program, others[0]) if len(others) == 1 else None
        if eps is None or eps.size != 1:
            raise NotRecognised("retention floors its row sums by something other than a constant")
        divisor, _ = _through(program, op.out, _REGROUP + CASTS)
        return float(eps.reshape(())), divisor
    return 0.0, reached


def recognise_retention(program: Program, output: Value) -> Retention | None:
    dots = [op for op in program.ops if op.prim == "dot_general"]
    if len(dots) != 2 or not program.depends_on(dots[1].args[0], dots[0].out):
        return None
    first, second = dots
    between = program.ops[program.ops.index(first) + 1:program.ops.index(second)]
    prims = {op.prim for op in between}
    if "reduce_max" in prims or not {"abs", "reduce_sum"} <= prims:
        return None  # attention, or another pair of matmuls
    rank = len(first.out.shape)
    batch = tuple(range(rank - 2))
    if tuple(map(tuple, first.params["dimension_numbers"][1])) != (batch, batch) or \
            tuple(map(tuple, first.params["dimension_numbers"][0])) != ((rank - 1,), (rank - 1,)):
        raise NotRecognised("retention's scores are not q k^T over (batch..., positions, dimension) inputs")
    if tuple(map(tuple, second.params["dimension_numbers"][1])) != (batch, batch) or \
            tuple(map(tuple, second.params["dimension_numbers"][0])) != ((rank - 1,), (rank - 2,)):
        raise NotRecognised("retention's second matmul does not take the scores times (batch..., positions, dim) v")
    q, k, v = (_input_behind(program, a, what) for a, what in
               ((first.args[0], "query"), (first.args[1], "key"), (second.args[1], "value")))
    if len({q.id, k.id, v.id}) != 3:
        raise NotRecognised("retention whose q, k and v are not three separate inputs")
    *batch_dims, seq, head_dim = q.shape
    if tuple(k.shape) != tuple(q.shape) or tuple(v.shape[:-1]) != (*batch_dims, seq):
        raise NotRecognised(f"retention with q {list(q.shape)}, k {list(k.shape)}, v {list(v.shape)}: the offline "
                            "brain needs as many keys as queries, all of one layout")
    weigh = _only_user(program, first.out, "score matrix")
    others = [a for a in weigh.args if not (isinstance(a, Value) and a.id == first.out.id)]
    if weigh.prim != "mul" or len(others) != 1 or not isinstance(others[0], Value) \
            or program.inputs_behind(others[0]):
        raise NotRecognised("retention's scores are not multiplied by a decay made from positions")
    rates, rate_shape = _rates(program, others[0], tuple(batch_dims), seq)
    weighted = weigh.out
    users = {op.prim: op for op in program.users(weighted)}
    if set(users) != {"abs", "div"} or len(program.users(weighted)) != 2:
        raise NotRecognised("retention's weighted scores are not divided by their rows' absolute sums")
    summed = _only_user(program, users["abs"].out, "absolute scores")
    if summed.prim != "reduce_sum" or tuple(summed.params["axes"]) != (rank - 1,):
        raise NotRecognised("retention does not sum its absolute scores along the keys")
    eps, divisor = _floor(program, summed.out)
    divide = users["div"]
    if divide.args[0] is not weighted and not (isinstance(divide.args[0], Value) and divide.args[0].id == weighted.id):
        raise NotRecognised("retention divides by its scores rather than dividing them")
    if not (isinstance(divide.args[1], Value) and divide.args[1].id == divisor.id):
        raise NotRecognised("retention divides its scores by something other than their rows' floored sums")
    normalised, _ = _through(program, divide.out, CASTS)
    if not (isinstance(second.args[0], Value) and second.args[0].id == normalised.id):
        raise NotRecognised("retention's normalised scores go through more than a cast before the second matmul")
    result, _ = _through(program, second.out, CASTS)
    if result.id != output.id:
        raise NotRecognised("retention's result goes through more than a cast to the output")
    return Retention(q=program.inputs.index(q), k=program.inputs.index(k), v=program.inputs.index(v),
                     batch_dims=tuple(batch_dims), seq=seq, head_dim=head_dim, v_dim=v.shape[-1], rates=rates,
                     rate_shape=rate_shape, eps=eps, dtype=q.dtype, v_dtype=v.dtype, out_dtype=output.dtype,
                     n_inputs=len(program.inputs), n_static=len(program.static))
