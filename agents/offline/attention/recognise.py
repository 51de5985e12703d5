"""Recognising attention by structure: two chained matmuls with a row softmax between them.

Each axis of the two dots gets a role label (batch, heads, query or key position, head dimension) from the dots'
dimension numbers, and the labels are carried back through the reshapes, transposes, repeats and casts to the
inputs and forward to the output. The ops on the scores before the softmax (a scale, an added bias input, a mask
built from positions) are kept in order, to be replayed on each score tile.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from agents.offline.attention.family import Attention
from agents.offline.attention.shape import ROLES, ScoreOp, final_shape
from agents.offline.expr import NotRecognised
from agents.offline.positions import causal_mismatch, kept_by_additive, position_value
from agents.offline.program import Op, Program, Value

_SAME = ("convert_element_type", "stop_gradient", "copy", "copy_p", "reduce_precision", "optimization_barrier")
_REGROUP = ("reshape", "squeeze", "expand_dims")
Labels = tuple[str, ...]  # the dot roles one array axis holds, outermost first


def _groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """A reshape from shape `a` to `b` as groups of adjacent axes whose sizes multiply alike (size-1 axes join the
    group before them). NotRecognised when the sizes do not regroup so."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) or j < len(b):
        ga, gb, pa, pb = [], [], 1, 1
        if i < len(a):
            pa, i = pa * a[i], i + 1
            ga.append(i - 1)
        if j < len(b):
            pb, j = pb * b[j], j + 1
            gb.append(j - 1)
        while pa != pb:
            if pa < pb and i < len(a):
                pa, i = pa * a[i], i + 1
                ga.append(i - 1)
            elif pb < pa and j < len(b):
                pb, j = pb * b[j], j + 1
                gb.append(j - 1)
            else:
                raise NotRecognised(f"a reshape from {list(a)} to {list(b)} that the offline brain cannot follow")
        while i < len(a) and a[i] == 1 and (j >= len(b) or b[j] != 1):
            ga.append(i)
            i += 1
        while j < len(b) and b[j] == 1 and (i >= len(a) or a[i] != 1):
            gb.append(j)
            j += 1
        groups.append((ga, gb))
    return groups


def _back(op: Op, out: list[Labels]) -> list[Labels]:
    """The labels of op's first operand's axes, from those of its result's."""
    if op.prim in _SAME or op.prim in ("mul", "div"):
        return list(out)
    arg = op.args[0]
    assert isinstance(arg, Value)
    if op.prim == "transpose":
        perm = op.params["permutation"]
        back: list[Labels] = [()] * len(perm)
        for i, p in enumerate(perm):
            back[p] = out[i]
        return back
    if op.prim == "broadcast_in_dim":
        dims = op.params["broadcast_dimensions"]
        return [out[d] if arg.shape[i] == op.out.shape[d] else () for i, d in enumerate(dims)]
    back = [()] * len(arg.shape)
    for ga, gb in _groups(arg.shape, op.out.shape):
        merged = tuple(label for j in gb for label in out[j])
        for i in ga:
            back[i] = merged
    return back


def _forward(op: Op, labels: list[Labels]) -> list[Labels]:
    """The labels of op's result's axes, from those of its first operand's."""
    arg = op.args[0]
    assert isinstance(arg, Value)
    if op.prim in _SAME:
        return list(labels)
    if op.prim == "transpose":
        return [labels[p] for p in op.params["permutation"]]
    out: list[Labels] = [()] * len(op.out.shape)
    for ga, gb in _groups(arg.shape, op.out.shape):
        # Size-1 axes carry their labels only where nothing larger is in their group (a kept batch of one).
        merged = tuple(label for i in ga for label in labels[i] if arg.shape[i] > 1) or \
            tuple(label for i in ga for label in labels[i])
        big = [j for j in gb if op.out.shape[j] > 1] or gb[:1]
        for j in gb:
            out[j] = merged if j in big else ()
    return out


def _scalar(arg: Any, program: Program | None = None) -> float | None:
    """The one value of a constant operand: a literal, or (with the program) a scalar expression of literals
    the reference computes, such as 1 / jnp.sqrt(head_dim), broadcast or converted on the way."""
    if isinstance(arg, int | float) and not isinstance(arg, bool):
        return float(arg)
    if program is None or not isinstance(arg, Value):
        return None
    value = position_value(program, arg)
    if value is None or value.size != 1:
        return None
    c = float(value.reshape(()))
    return c if math.isfinite(c) else None


def _trace_back(program: Program, arg: Any, labels: list[Labels], what: str) -> tuple[Value, list[Labels], float]:
    """The input behind a dot operand, its axes' labels, and a constant the operand was scaled by on the way."""
    scale = 1.0
    through = _SAME + _REGROUP + ("broadcast_in_dim", "transpose", "mul", "div")
    while isinstance(arg, Value):
        if any(arg.id == v.id for v in program.inputs):
            return arg, labels, scale
        producer = program.producer(arg)
        if producer is None or producer.prim not in through:
            break
        if producer.prim in ("mul", "div"):
            constants = [_scalar(a, program) for a in producer.args]
            if producer.prim == "mul" and len(producer.args) == 2 and constants.count(None) == 1:
                scale *= next(c for c in constants if c is not None)
                labels = _back(producer, labels)
                arg = next(a for a in producer.args if isinstance(a, Value))
                continue
            if producer.prim == "div" and constants[0] is None and constants[1] is not None:
                scale /= constants[1]
                labels = _back(producer, labels)
                arg = producer.args[0]
                continue
            break
        labels = _back(producer, labels)
        arg = producer.args[0]
    raise NotRecognised(f"attention's {what} is computed inside the reference (not a reshaped, repeated or "
                        "converted input)")


def _order(labels: list[Labels], shape: tuple[int, ...], roles: dict[str, str], what: str) -> tuple[str, ...]:
    """Each axis's canonical role from its labels: `roles` maps a label to a role; the batch-like labels (B*, G*)
    go to "b" for B0 and to "h" for the others."""
    order = []
    for axis, (labs, size) in enumerate(zip(labels, shape, strict=True)):
        # A size-1 axis keeps the role its labels give it (a batch of one at these shapes is a batch at others).
        named = {roles[lab] for lab in labs if lab in roles}
        if named:
            if len(named) > 1 or len(labs) > 1:
                raise NotRecognised(f"attention's {what} merges its {' and '.join(sorted(named))} axes into one "
                                    f"(axis {axis} of {list(shape)})")
            order.append(named.pop())
        elif labs and all(lab.startswith(("B", "G")) for lab in labs):
            order.append("b" if labs == ("B0",) else "h")
        elif size == 1:
            order.append("1")
        else:
            raise NotRecognised(f"attention's {what} has an axis ({axis} of {list(shape)}) the offline brain cannot "
                                "place among batch, heads, sequence and head dimension")
    present = [r for r in order if r != "1"]
    if len(set(present)) != len(present):
        raise NotRecognised(f"attention's {what} has two axes of one role ({order})")
    if "s" not in present or "d" not in present:
        raise NotRecognised(f"attention's {what} has no sequence or head-dimension axis")
    return tuple(order)


def _size(order: tuple[str, ...], shape: tuple[int, ...], role: str) -> int:
    return shape[order.index(role)] if role in order else 1



def _check_causal(kept: np.ndarray | None, score_shape: tuple[int, ...], score_labels: list[Labels]) -> None:
    """NotRecognised when a mask made from positions keeps other keys than the causal mask does, at the
    production lengths (a mask the program hides from numpy is left to the numbers check on small inputs)."""
    if kept is None or ("Q",) not in score_labels or ("K",) not in score_labels:
        return
    mismatch = causal_mismatch(kept, score_shape, score_labels.index(("Q",)), score_labels.index(("K",)))
    if mismatch is not None:
        raise NotRecognised(f"attention masks its scores with {mismatch}; the offline brain writes causal masks "
                            "(each query sees the keys at or before it) only")


def _score_ops(program: Program, first: Op, reducer: Op, q_scale: float,
               score_labels: list[Labels]) -> tuple[tuple[ScoreOp, ...], int | None, tuple[str, ...]]:
    """What happens to the scores between the first dot and the softmax's max, in order; the bias input and its
    axes' roles over (b, h, q, k)."""
    ops: list[ScoreOp] = [ScoreOp("scale", q_scale)] if q_scale != 1.0 else []
    bias, bias_order = None, ()
    main = first.out
    while main.id != reducer.args[0].id:  # type: ignore[union-attr]
        users = [op for op in program.users(main) if op is not reducer]
        if len(users) != 1:
            raise NotRecognised("attention's scores are used more than once before the softmax")
        op = users[0]
        others = [a for a in op.args if not (isinstance(a, Value) and a.id == main.id)]
        if op.out.shape != main.shape:
            raise NotRecognised(f"attention's scores are reshaped ({op.prim}) before the softmax")
        if op.prim in _SAME:
            pass
        elif op.prim in ("mul", "div") and len(others) == 1 and _scalar(others[0], program) is not None:
            c = _scalar(others[0], program)
            assert c is not None
            if op.prim == "div" and op.args[0] is not main and not (isinstance(op.args[0], Value)
                                                                  and op.args[0].id == main.id):
                raise NotRecognised("attention divides a constant by its scores")
            ops.append(ScoreOp("scale", c if op.prim == "mul" else 1.0 / c))
        elif op.prim == "add" and len(others) == 1 and isinstance(others[0], Value):
            sources = program.inputs_behind(others[0])
            if not sources:
                if not any(o.prim == "iota" for o in program.ops):
                    raise NotRecognised("attention adds a constant array to its scores")
                value = position_value(program, others[0])
                kept = kept_by_additive(value) if value is not None else None
                if value is not None and kept is None:
                    raise NotRecognised("attention adds position-dependent values to its scores (a bias made from "
                                        "positions, not a mask); the offline brain writes causal masks")
                _check_causal(kept, main.shape, score_labels)
                ops.append(ScoreOp("causal"))  # an additive mask built from positions
            elif bias is not None or len(sources) != 1:
                raise NotRecognised("attention adds more than one input to its scores")
            else:
                bias, bias_order = _bias(program, others[0], score_labels)
                ops.append(ScoreOp("bias"))
        elif op.prim == "select_n" and len(op.args) == 3 and isinstance(op.args[2], Value) \
                and op.args[2].id == main.id:
            if program.inputs_behind(op.args[0]) or program.inputs_behind(op.args[1]):
                raise NotRecognised("attention masks its scores with an input mask; the offline brain writes "
                                    "causal masks (built from positions) only")
            _check_causal(position_value(program, op.args[0]), main.shape, score_labels)
            ops.append(ScoreOp("causal"))
        else:
            raise NotRecognised(f"attention's scores go through {op.prim} before the softmax, which the offline "
                                "brain does not replay")
        main = op.out
    return tuple(ops), bias, bias_order


def _bias(program: Program, value: Value, score_labels: list[Labels]) -> tuple[int, tuple[str, ...]]:
    """The bias input and the role of each of its axes over the scores (b, h, q, k)."""
    source, labels, scale = _trace_back(program, value, list(score_labels), "score bias")
    if scale != 1.0:
        raise NotRecognised("attention scales its bias input by a constant")
    roles = {"Q": "q", "K": "k"}
    order = []
    for labs, size in zip(labels, source.shape, strict=True):
        named = {roles[lab] for lab in labs if lab in roles}
        if len(labs) == 1 and named:
            order.append(named.pop())
        elif labs and all(lab.startswith(("B", "G")) for lab in labs):
            order.append("b" if labs == ("B0",) else "h")
        elif size == 1:
            order.append("1")
        else:
            raise NotRecognised(f"attention's score bias {list(source.shape)} has an axis the offline brain cannot "
                                "place among batch, heads, queries and keys")
    return program.inputs.index(source), tuple(order)


def recognise_attention(program: Program, dots: list[Op], output: Value) -> Attention:
    first, second = dots
    p_side = [i for i in (0, 1) if program.depends_on(second.args[i], first.out)]
    if len(p_side) != 1:
        raise NotRecognised("two matmuls that are not chained as attention")
    between = program.ops[program.ops.index(first) + 1:program.ops.index(second)]
    reducers = [op for op in between if op.prim == "reduce_max"]
    if not reducers or not {"exp", "reduce_sum"} <= {op.prim for op in between}:
        raise NotRecognised("two chained matmuls without a softmax between them (not attention)")
    reducer = reducers[0]
    (lc, rc), (lb, rb) = first.params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    if len(lc) != 1 or len(rc) != 1:
        raise NotRecognised("attention's scores contract more than one axis")
    a_shape, b_shape = first.args[0].shape, first.args[1].shape  # type: ignore[union-attr]
    a_free = [i for i in range(len(a_shape)) if i not in lc + lb]
    b_free = [i for i in range(len(b_shape)) if i not in rc + rb]
    reduced = tuple(reducer.params["axes"])
    if len(reduced) != 1 or reducer.args[0].shape != first.out.shape:  # type: ignore[union-attr]
        raise NotRecognised("attention's softmax does not reduce one axis of the scores")
    key_axis = reduced[0]
    n_batch = len(lb)
    # The scores' axes: batch, then the left operand's free axes, then the right's; the softmax's axis is the keys'.
    if key_axis == n_batch + len(a_free) + len(b_free) - 1 and len(b_free) == 1:
        q_arg, k_arg, q_c, k_c, q_b, k_b, q_free = first.args[0], first.args[1], lc, rc, lb, rb, a_free
    elif key_axis == n_batch + len(a_free) - 1 and len(a_free) == 1:
        q_arg, k_arg, q_c, k_c, q_b, k_b, q_free = first.args[1], first.args[0], rc, lc, rb, lb, b_free
    else:
        raise NotRecognised("attention's softmax runs over an axis that is not the keys'")
    if n_batch > 2:
        raise NotRecognised("attention with more than two batch axes (batch and heads)")
    q_labels: list[Labels] = [()] * len(q_arg.shape)  # type: ignore[union-attr]
    k_labels: list[Labels] = [()] * len(k_arg.shape)  # type: ignore[union-attr]
    for j, (qa, ka) in enumerate(zip(q_b, k_b, strict=True)):
        q_labels[qa] = k_labels[ka] = (f"B{j}",)
    q_labels[q_c[0]] = k_labels[k_c[0]] = ("D",)
    for j, axis in enumerate(q_free):
        q_labels[axis] = ("Q",) if j == len(q_free) - 1 else (f"G{j}",)
    k_free = [i for i in range(len(k_labels)) if not k_labels[i]]
    k_labels[k_free[0]] = ("K",)
    score_labels = [(f"B{j}",) for j in range(n_batch)] + [q_labels[a] for a in q_free] + [("K",)]
    if first.args[0] is k_arg:
        score_labels = [(f"B{j}",) for j in range(n_batch)] + [("K",)] + [q_labels[a] for a in q_free]
    # The second dot: p (the scores' labels) against v.
    p_i = p_side[0]
    p_arg, v_arg = second.args[p_i], second.args[1 - p_i]
    if p_arg.shape != first.out.shape:  # type: ignore[union-attr]
        raise NotRecognised("attention's probabilities are reshaped before the second matmul")
    (lc2, rc2), (lb2, rb2) = second.params["dimension_numbers"]
    p_c, v_c, p_b, v_b = (lc2, rc2, lb2, rb2) if p_i == 0 else (rc2, lc2, rb2, lb2)
    if len(p_c) != 1 or score_labels[p_c[0]] != ("K",):
        raise NotRecognised("attention's second matmul does not contract the keys")
    v_labels: list[Labels] = [()] * len(v_arg.shape)  # type: ignore[union-attr]
    for pa, va in zip(p_b, v_b, strict=True):
        v_labels[va] = score_labels[pa]
    v_labels[v_c[0]] = ("K",)
    v_free = [i for i in range(len(v_labels)) if i not in tuple(v_c) + tuple(v_b)]
    if len(v_free) != 1:
        raise NotRecognised("attention's values have more than one free axis")
    v_labels[v_free[0]] = ("E",)
    p_free = [a for a in range(len(score_labels)) if a not in tuple(p_c) + tuple(p_b)]
    out_labels = [score_labels[a] for a in p_b] + (
        [score_labels[a] for a in p_free] + [("E",)] if p_i == 0 else [("E",)] + [score_labels[a] for a in p_free])
    q_v, q_in, q_scale = _trace_back(program, q_arg, q_labels, "query")
    k_v, k_in, k_scale = _trace_back(program, k_arg, k_labels, "key")
    v_v, v_in, v_scale = _trace_back(program, v_arg, v_labels, "value")
    if len({q_v.id, k_v.id, v_v.id}) != 3:
        raise NotRecognised("attention whose q, k and v are not three separate inputs")
    if v_scale != 1.0:
        raise NotRecognised("attention scales its values by a constant")
    q_order = _order(q_in, q_v.shape, {"Q": "s", "D": "d"}, "query")
    k_order = _order(k_in, k_v.shape, {"K": "s", "D": "d"}, "key")
    v_order = _order(v_in, v_v.shape, {"K": "s", "E": "d"}, "value")
    out_order, out_dims = _output_order(program, second, out_labels, output)
    score_ops, bias, bias_order = _score_ops(program, first, reducer, q_scale * k_scale, score_labels)
    batch, heads = _size(q_order, q_v.shape, "b"), _size(q_order, q_v.shape, "h")
    kv_heads = _size(k_order, k_v.shape, "h")
    seq, kv_seq = _size(q_order, q_v.shape, "s"), _size(k_order, k_v.shape, "s")
    head_dim, v_dim = _size(q_order, q_v.shape, "d"), _size(v_order, v_v.shape, "d")
    if (_size(k_order, k_v.shape, "b"), _size(v_order, v_v.shape, "b")) != (batch, batch) \
            or _size(v_order, v_v.shape, "h") != kv_heads or _size(v_order, v_v.shape, "s") != kv_seq \
            or _size(k_order, k_v.shape, "d") != head_dim or heads % kv_heads:
        raise NotRecognised(f"attention with q {list(q_v.shape)}, k {list(k_v.shape)}, v {list(v_v.shape)}: the "
                            "offline brain needs k and v alike and query heads a multiple of the K/V heads")
    sizes = {"b": batch, "h": heads, "s": seq, "d": v_dim}
    if final_shape(out_dims, sizes) != tuple(output.shape) or \
            not {r for r in ROLES if sizes[r] > 1} | {"s", "d"} <= set(out_order):
        raise NotRecognised("attention whose output is not one row per query and head")
    return Attention(q=program.inputs.index(q_v), k=program.inputs.index(k_v), v=program.inputs.index(v_v),
                     bias=bias, q_order=q_order, k_order=k_order, v_order=v_order, bias_order=bias_order,
                     out_order=out_order, out_dims=out_dims, batch=batch, heads=heads, kv_heads=kv_heads, seq=seq,
                     kv_seq=kv_seq, head_dim=head_dim, v_dim=v_dim, score_ops=score_ops, dtype=q_v.dtype,
                     v_dtype=v_v.dtype, out_dtype=output.dtype, n_inputs=len(program.inputs),
                     n_static=len(program.static))


def _output_order(program: Program, second: Op, labels: list[Labels], output: Value
                  ) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    """The output's roles before its final reshape, and each final axis as the roles whose sizes it multiplies
    (a reshape that merges heads and head dimension into one axis, say), so the kernel serves any size."""
    value = second.out
    roles = {"Q": "s", "E": "d"}
    order: tuple[str, ...] | None = None
    shape: tuple[int, ...] = ()
    while True:
        with contextlib.suppress(NotRecognised):  # axes merged for now; a later reshape may part them again
            order, shape = _order(labels, value.shape, roles, "output"), value.shape
        if value.id == output.id:
            break
        users = program.users(value)
        if len(users) != 1 or users[0].prim not in _SAME + _REGROUP + ("transpose",):
            raise NotRecognised("attention's result goes through more than a transpose, a reshape or a cast")
        if users[0].prim == "transpose" and order is not None and shape != value.shape:
            raise NotRecognised("attention's result is transposed after its axes were merged")
        labels = _forward(users[0], labels)
        value = users[0].out
    if order is None:
        raise NotRecognised("attention's output has axes the offline brain cannot place")
    dims: list[tuple[str, ...]] = []
    for ga, gb in _groups(shape, output.shape):
        merged = tuple(order[i] for i in ga if order[i] != "1")
        big = [j for j in gb if output.shape[j] > 1]
        if len(big) > 1:
            raise NotRecognised("attention's output splits an axis after the second matmul")
        home = big[0] if big else gb[0] if gb else None
        if home is None and merged:
            raise NotRecognised("attention's output drops an axis")
        dims += [merged if j == home else () for j in gb]
    return order, tuple(dims)
