"""Attention: scaled dot-product attention, causal or not, with grouped-query heads, in any head layout, with an
additive score bias.

Recognised by structure: two chained matmuls with a row softmax between them. Each axis of the two dots gets a
role label (batch, heads, query or key position, head dimension) from the dots' dimension numbers, and the labels
are carried back through the reshapes, transposes, repeats and casts to the inputs and forward to the output; so
(batch, heads, seq, dim) and (batch, seq, heads, dim) inputs, `jnp.repeat`ed K/V heads and query heads reshaped
into groups are all the same family. The ops on the scores before the softmax (a scale, an added bias input, a
mask built from positions) are kept in order and replayed on each score tile. Then confirmed by numbers: the
reference and a plain model of attention with what was read off the program are run on the same small inputs,
and anything else that merely looks like attention is refused.

The kernel is flash attention: a grid over (batch, head group, query block, key block), the key axis last and
'arbitrary', a running max, sum and f32 accumulator in VMEM. Query heads that share a K/V head are processed
together (HEADS_PER_STEP of them stacked as rows of one tile), so each K/V block is fetched once for the group; a
(batch, seq, heads, dim) array is read in place, its heads side by side on the lanes (no transpose in HBM). When
causal, key blocks above the diagonal are skipped and not even fetched.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.offline.expr import NotRecognised
from agents.offline.kernel_family import floor_in
from agents.offline.positions import causal_mismatch, kept_by_additive, position_value
from agents.offline.program import Op, Program, Value, itemsize
from tpu_runner.hardware.targets import ChipSpec

MiB = 2**20
ROLES = ("b", "h", "s", "d")  # the canonical layout every input is read as
_SAME = ("convert_element_type", "stop_gradient", "copy", "copy_p", "reduce_precision", "optimization_barrier")
_REGROUP = ("reshape", "squeeze", "expand_dims")
Labels = tuple[str, ...]  # the dot roles one array axis holds, outermost first


@dataclass(frozen=True)
class ScoreOp:
    """One step of what the reference does to the scores before the softmax, replayed on each tile."""

    kind: str  # "scale" (times a constant), "bias" (plus the bias input), "causal" (keys after the query masked)
    value: float = 1.0


@dataclass(frozen=True)
class Attention:
    q: int  # input positions
    k: int
    v: int
    bias: int | None
    q_order: tuple[str, ...]  # the role of each input axis ("1": a size-1 axis without one)
    k_order: tuple[str, ...]
    v_order: tuple[str, ...]
    bias_order: tuple[str, ...]  # over (b, h, q, k); "1" where the bias broadcasts
    out_order: tuple[str, ...]  # the output's axes before its final reshape
    out_dims: tuple[tuple[str, ...], ...]  # after it: each axis the product of these roles' sizes
    batch: int
    heads: int
    kv_heads: int
    seq: int
    kv_seq: int
    head_dim: int
    v_dim: int
    score_ops: tuple[ScoreOp, ...]
    dtype: str  # q's dtype
    v_dtype: str
    out_dtype: str
    n_inputs: int
    n_static: int

    family = "attention"
    reduces = True

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def causal(self) -> bool:
        return any(op.kind == "causal" for op in self.score_ops)

    @property
    def scale(self) -> float:
        return math.prod(op.value for op in self.score_ops if op.kind == "scale")

    def describe(self) -> str:
        kind = "causal " if self.causal else ""
        heads = f"{self.heads} heads" + (f" sharing {self.kv_heads} K/V heads" if self.group > 1 else "")
        bias = " plus a score bias" if self.bias is not None else ""
        layout = "".join(r for r in self.q_order if r != "1")
        return (f"{kind}attention, batch {self.batch}, {heads}, {self.seq} queries x {self.kv_seq} keys of "
                f"dimension {self.head_dim} ({self.dtype}, {layout} layout), scale {self.scale:.4g}{bias}")

    def space(self) -> dict[str, tuple[Any, ...]]:
        return attention_space(self)

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        return attention_params(self, chip)

    def strategy(self) -> str:
        return ("Flash attention in one pallas_call: a grid over (batch, head group, query block, key block); per "
                "key block the scores stay in VMEM and an online softmax (running max and sum) rescales an f32 "
                "accumulator; the output is written once, at the last key block."
                + (" Query heads sharing a K/V head are stacked as the rows of one tile, so each K/V block is "
                   "fetched once per group." if self.group > 1 else ""))

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return attention_source(self, params, header, tunable_text)


# --- recognising ----------------------------------------------------------------------------------------------


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


def _depends_on(program: Program, later: Any, earlier: Value) -> bool:
    frontier, seen = [later], set()
    while frontier:
        v = frontier.pop()
        if not isinstance(v, Value):
            continue
        if v.id == earlier.id:
            return True
        if v.id in seen:
            continue
        seen.add(v.id)
        producer = program.producer(v)
        if producer is not None:
            frontier += list(producer.args)
    return False


def _from_inputs(program: Program, value: Any) -> set[int]:
    """The program inputs a value is computed from (empty: from constants and positions only)."""
    found, frontier, seen = set(), [value], set()
    ids = {v.id: i for i, v in enumerate(program.inputs)}
    while frontier:
        v = frontier.pop()
        if not isinstance(v, Value) or v.id in seen:
            continue
        seen.add(v.id)
        if v.id in ids:
            found.add(ids[v.id])
            continue
        producer = program.producer(v)
        if producer is not None:
            frontier += list(producer.args)
    return found


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


def final_shape(dims: tuple[tuple[str, ...], ...], sizes: dict[str, int]) -> tuple[int, ...]:
    return tuple(math.prod(sizes[r] for r in roles) for roles in dims)


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
            sources = _from_inputs(program, others[0])
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
            if _from_inputs(program, op.args[0]) or _from_inputs(program, op.args[1]):
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
    p_side = [i for i in (0, 1) if _depends_on(program, second.args[i], first.out)]
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


# --- checking by numbers -----------------------------------------------------------------------------------------


def canonical(x: Any, order: tuple[str, ...], roles: tuple[str, ...] = ROLES) -> Any:
    """An array whose axes have the roles of `order` as the 4-D array of `roles` (size 1 for a role it lacks)."""
    import jax.numpy as jnp

    keep = [i for i, r in enumerate(order) if r != "1"]
    names = [order[i] for i in keep]
    x = jnp.reshape(x, [x.shape[i] for i in keep])
    present = [r for r in roles if r in names]
    x = jnp.transpose(x, [names.index(r) for r in present])
    return jnp.reshape(x, [x.shape[present.index(r)] if r in present else 1 for r in roles])


def model(inputs: Sequence[Any], spec: Attention) -> Any:
    """Plain attention with what was read off the program, in f32 (what the reference must agree with)."""
    import jax.numpy as jnp  # run only in the sandboxed child; recognising and writing attention need no jax

    q = canonical(jnp.asarray(inputs[spec.q], jnp.float32), spec.q_order)
    k = canonical(jnp.asarray(inputs[spec.k], jnp.float32), spec.k_order)
    v = canonical(jnp.asarray(inputs[spec.v], jnp.float32), spec.v_order)
    group = q.shape[1] // k.shape[1]
    k, v = jnp.repeat(k, group, axis=1), jnp.repeat(v, group, axis=1)
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
    for op in spec.score_ops:
        if op.kind == "scale":
            s = s * op.value
        elif op.kind == "bias":
            assert spec.bias is not None
            s = s + canonical(jnp.asarray(inputs[spec.bias], jnp.float32), spec.bias_order, ("b", "h", "q", "k"))
        else:
            mask = jnp.arange(q.shape[2])[:, None] >= jnp.arange(k.shape[2])[None, :]
            s = jnp.where(mask, s, -jnp.inf)
    s = s - s.max(axis=-1, keepdims=True)
    p = jnp.exp(s)
    out = jnp.einsum("bhqk,bhkd->bhqd", p / p.sum(axis=-1, keepdims=True), v)
    return from_canonical(out, spec.out_order, spec.out_dims)


def from_canonical(x: Any, order: tuple[str, ...], dims: tuple[tuple[str, ...], ...]) -> Any:
    """A (b, h, s, d) array as the output: its roles in `order`, then reshaped to `dims`."""
    import jax.numpy as jnp

    names = [r for r in order if r != "1"]
    present = [r for r in ROLES if r in names]
    sizes = dict(zip(ROLES, x.shape, strict=True))
    x = jnp.reshape(x, [sizes[r] for r in present])
    return jnp.reshape(jnp.transpose(x, [present.index(r) for r in names]), final_shape(dims, sizes))


def confirm(reference: Any, spec: Attention, values: list[Any], static: tuple[Any, ...]) -> None:
    """Run the reference and the model on the same inputs; NotRecognised unless they agree."""
    import jax.numpy as jnp

    want = np.asarray(jnp.asarray(reference(*values, *static), jnp.float32))
    got = np.asarray(model(values, spec))
    tol = 2e-2 if "bfloat16" in (spec.dtype, spec.out_dtype) else 1e-4
    worst = float(np.max(np.abs(got - want) / (tol + tol * np.abs(want))))
    if not math.isfinite(worst) or worst > 1.0:
        raise NotRecognised(f"the reference looks like attention ({spec.describe()}) but does not compute it: it "
                            "differs from scaled dot-product attention with those parameters")


# --- parameters ---------------------------------------------------------------------------------------------------


def _lanes(order: tuple[str, ...], d: int) -> bool:
    """Read in place as (batch, seq, heads x dim) with a head's dim on the lanes: the (b, s, h, d) layout."""
    return tuple(r for r in order if r != "1") == ("b", "s", "h", "d") and d % 128 == 0


def _head_choices(spec: Attention) -> tuple[int, ...]:
    """Query heads per grid step: divisors of the group. Only where q and the output are read in place on the
    lanes: a (heads, queries, dim) block of the (b, h, s, d) layout leaves libtpu's static profile empty (0
    cycles), and the evaluator could not time the kernel."""
    if not (_lanes(spec.q_order, spec.head_dim) and _lanes(spec.out_order, spec.v_dim)):
        return (1,)
    return tuple(h for h in (1, 2, 4, 8, 16) if spec.group % h == 0)


def _square_causal(spec: Attention) -> bool:
    """Causal over equal query and key lengths: the grid visits only the blocks on or below the diagonal."""
    return spec.causal and spec.seq == spec.kv_seq


def _folded_scale(spec: Attention) -> float:
    """The scale applied before anything else touches the scores, which can go on q instead (d columns, not
    block_kv); later scale ops stay on the scores."""
    scale = 1.0
    for op in spec.score_ops:
        if op.kind != "scale":
            break
        scale *= op.value
    return scale


def attention_space(spec: Attention) -> dict[str, tuple[Any, ...]]:
    space: dict[str, tuple[Any, ...]] = {"BLOCK_Q": (128, 256, 512, 1024)}
    if not _square_causal(spec):  # (square causal grids pair query and key blocks of one size)
        space["BLOCK_KV"] = (128, 256, 512, 1024)
    space["HEADS_PER_STEP"] = _head_choices(spec)
    # K read as (dim, keys): the scores' matmul then needs no transpose of each K block in VMEM, at the price of
    # one transpose of K in HBM.
    space["TRANSPOSE_K"] = (False, True)
    space["VMEM_LIMIT_BYTES"] = tuple(m * MiB for m in (32, 64, 100))
    return space


def attention_params(spec: Attention, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
    space = attention_space(spec)
    square = _square_causal(spec)
    bq = floor_in(space["BLOCK_Q"], min(1024 if spec.group > 1 else 512, spec.seq))
    bkv = bq if square else floor_in(space["BLOCK_KV"], min(512, spec.kv_seq))
    # Enough query rows per step that each K/V block feeds ~2048 rows of the MXU, from the heads that share it.
    hb = floor_in(space["HEADS_PER_STEP"], max(1, 2048 // bq))
    flops = 4 * spec.batch * spec.heads * spec.seq * spec.kv_seq * spec.head_dim / (2 if spec.causal else 1)
    size = itemsize(spec.dtype)
    q_bytes = spec.batch * spec.heads * spec.seq * spec.head_dim * size
    kv_bytes = spec.batch * spec.kv_heads * spec.kv_seq * spec.head_dim * size * 2
    # Transposing K in HBM pays when K is small beside Q (grouped heads): one copy of K against a transpose of
    # each K block in VMEM for every query block.
    transpose_k = spec.group > 1
    reasons = [f"Attention does {flops / 1e9:.0f} GFLOP on {(q_bytes + kv_bytes) / MiB:.0f} MiB of q, k and v: "
               "compute-bound once the score matrix stays in VMEM.",
               f"Query blocks of {bq} and key blocks of {bkv}: the {hb * bq}x{bkv} f32 score tile and the "
               f"{hb * bq}x{spec.v_dim} accumulator stay in VMEM; K/V blocks are re-read once per query block."]
    if square:
        reasons.append("Causal: the grid visits only the blocks on or below the diagonal, query block i paired with "
                       "block n-1-i so that every row of the grid has n+1 steps of equal work; the mask is applied "
                       "on the diagonal blocks only. About half the work of the full matrix.")
    elif spec.causal:
        reasons.append("Causal with different query and key lengths: every block is computed and masked.")
    if spec.group > 1:
        reasons.append(f"{spec.group} query heads share each K/V head: the index map sends head h to K/V head "
                       f"h / {spec.group}, so K and V are never repeated in HBM, and {hb} of them are stacked in one "
                       f"tile so each K/V block fetched serves {hb * bq} query rows.")
    if _lanes(spec.q_order, spec.head_dim):
        reasons.append("The (batch, seq, heads, dim) inputs are read in place: a block is a run of positions of "
                       "one head, its dimension on the lanes, so no transpose goes through HBM.")
    if transpose_k:
        reasons.append(f"K ({kv_bytes / 2 / MiB:.0f} MiB) is transposed once in HBM to (dim, keys), so the scores' "
                       "matmul takes each block as it comes, with no transpose in VMEM.")
    if spec.v_dim % 128 == 0:
        reasons.append("The softmax's row sums come from the MXU: V is extended by a column block of ones in VMEM, "
                       "so p @ [V | 1] gives the sums beside the output (a 128-wide V leaves half of v6e's 256-wide "
                       "MXU idle).")
    if _folded_scale(spec) != 1.0:
        reasons.append("The scale multiplies q (d columns) rather than the scores (block_kv columns).")
    if spec.bias is not None:
        reasons.append("The score bias is read one (query block x key block) tile at a time beside the scores.")
    params = {"BLOCK_Q": bq, **({} if square else {"BLOCK_KV": bkv}), "HEADS_PER_STEP": hb,
              "TRANSPOSE_K": transpose_k, "VMEM_LIMIT_BYTES": 64 * MiB}
    return params, reasons


# --- the kernel's source ----------------------------------------------------------------------------------------


_NAMES = {"b": "batch", "h": "heads", "s": "seq", "d": "dv"}  # the output's role sizes in the wrapper
_SIZE_INDEX = {"b": 0, "h": 1, "s": 2, "d": 3, "q": 2, "k": 3}  # a role's place in its `name`_sizes tuple


def _sizes(name: str, arg: str, order: tuple[str, ...], roles: tuple[str, ...]) -> str:
    """The wrapper's line naming the sizes of an input's roles (1 for a role it lacks)."""
    index = [order.index(r) if r in order else -1 for r in roles]
    return f"    {name}_sizes = tuple({arg}.shape[i] if i >= 0 else 1 for i in {index})\n"


def _prepare(name: str, arg: str, order: tuple[str, ...], roles: tuple[str, ...], lanes: bool = False,
             indent: str = "    ") -> str:
    """The wrapper's line reading an input as the 4-D array of `roles`, or for the (b, s, h, d) layout in place
    as (b, s, h x d), a head's dimension on the lanes."""
    present = [r for r in order if r != "1"]
    if lanes:
        value = f"{arg}.reshape({name}_sizes[0], {name}_sizes[2], {name}_sizes[1] * {name}_sizes[3])"
    else:
        shape = "(" + ", ".join(f"{name}_sizes[{_SIZE_INDEX[r]}]" for r in roles) + ",)"
        if present == [r for r in roles if r in present]:
            value = f"{arg}.reshape({shape})"
        else:
            keep = [i for i, r in enumerate(order) if r != "1"]
            perm = [present.index(r) for r in roles if r in present]
            value = f"jnp.transpose({arg}.reshape([{arg}.shape[i] for i in {keep}]), {perm}).reshape({shape})"
    return f"{indent}{name} = {value}\n"


def _finish(spec: Attention, lanes: bool) -> str:
    """The wrapper's last lines: the kernel's output in the reference's layout and shape."""
    final = "(" + ", ".join(" * ".join(_NAMES[r] for r in roles) or "1" for roles in spec.out_dims) + ",)"
    if lanes:
        return f"    return out.reshape({final})"
    names = [r for r in spec.out_order if r != "1"]
    present = [r for r in ROLES if r in names]
    return (f"    out = out.reshape({'(' + ', '.join(_NAMES[r] for r in present) + ',)'})\n"
            f"    return jnp.transpose(out, {[present.index(r) for r in names]}).reshape({final})")


def _bias_spec(order: tuple[str, ...]) -> str:
    """The bias's block over its 4-D (b, h, q, k) array and its index map (size-1 axes broadcast in the kernel)."""
    present = {r for r in order if r != "1"}
    block = ", ".join(["None", "hb" if "h" in present else "1", "block_q" if "q" in present else "1",
                       "block_kv" if "k" in present else "1"])
    index = ", ".join(["b" if "b" in present else "0", "hh" if "h" in present else "0",
                       "q_at(i, j)" if "q" in present else "0", "kv_at(i, j)" if "k" in present else "0"])
    return f"pl.BlockSpec(({block}), lambda b, hh, i, j: ({index}))"


_PAIRED = '''def _positions(i, j, n_q):
    """The square causal grid: its row i is query block i (steps j <= i), then query block n_q - 1 - i, each
    against the key blocks up to its diagonal: n_q + 1 steps of equal work (for odd n_q the middle block's row
    is computed twice)."""
    first = j <= i
    return jnp.where(first, i, n_q - 1 - i), jnp.where(first, j, j - i - 1)


def _starts(i, j, qi, kv):
    return jnp.logical_or(j == 0, j == i + 1)


def _ends(i, j, qi, kv):
    return kv == qi
'''
_RECTANGLE = '''def _positions(i, j, n_q):
    return i, j


def _starts(i, j, qi, kv):
    return j == 0


def _ends(i, j, qi, kv):
    return j == pl.num_programs(3) - 1
'''
_ONES_SUM = '''    # p @ [V | 1]: the row sums come out of the MXU beside the output.
    vv = jnp.concatenate([v_ref[...], jnp.ones_like(v_ref[...])], axis=1)
    pv = lax.dot_general(p{cast}, vv, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    l_ref[...] = alpha * l_ref[...] + pv[:, dv:dv + 1]
    acc_ref[...] = alpha * acc_ref[...] + pv[:, :dv]
'''
_VPU_SUM = '''    l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
    acc_ref[...] = alpha * acc_ref[...] + lax.dot_general(p{cast}, v_ref[...], (((1,), (0,)), ((), ())),
                                                          preferred_element_type=jnp.float32)
'''


def _score_lines(spec: Attention) -> list[str]:
    """The kernel's lines replaying the reference's ops on the score tile `s` (a leading scale went on q)."""
    lines, leading = [], _folded_scale(spec) != 1.0
    for op in spec.score_ops:
        if op.kind == "scale" and leading:
            continue
        leading = False
        if op.kind == "scale":
            lines.append(f"    s = s * {op.value!r}")
        elif op.kind == "bias":
            lines.append("    s = s + _stacked_bias(bias_ref, hb, block_q, block_kv)")
        elif _square_causal(spec):  # only the diagonal block holds masked keys
            lines.append("    s = lax.cond(kv == qi, functools.partial(_causal_mask, block_q=block_q, offset=0), "
                         "lambda s: s, s)")
        else:
            lines.append("    s = _causal_mask(s, block_q=block_q, offset=qi * block_q - kv * block_kv)")
    return lines


def attention_source(spec: Attention, params: dict[str, Any], header: str, tunable_text: str) -> str:
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    cast = ".astype(v_ref.dtype)" if spec.v_dtype in ("bfloat16", "float16") else ""
    paired = _square_causal(spec)
    folded = _folded_scale(spec)
    q_lanes, k_lanes = _lanes(spec.q_order, spec.head_dim), _lanes(spec.k_order, spec.head_dim)
    v_lanes, o_lanes = _lanes(spec.v_order, spec.v_dim), _lanes(spec.out_order, spec.v_dim)
    bias = spec.bias is not None
    q_read = "_rows_from_lanes(q_ref, hb, d)" if q_lanes else "q_ref[...].reshape(hb * block_q, d)"
    if folded != 1.0:
        q_read = f"({q_read}.astype(jnp.float32) * {folded!r}).astype(q_ref.dtype)"
    store = ("        for h in range(hb):\n"
             "            o_ref[:, h * dv:(h + 1) * dv] = out[h * block_q:(h + 1) * block_q].astype(o_ref.dtype)"
             if o_lanes else "        o_ref[...] = out.reshape(o_ref.shape).astype(o_ref.dtype)")
    q_spec = ("pl.BlockSpec((None, block_q, hb * d), lambda b, hh, i, j: (b, q_at(i, j), hh))" if q_lanes
              else "pl.BlockSpec((None, hb, block_q, d), lambda b, hh, i, j: (b, hh, q_at(i, j), 0))")
    k_spec = ("pl.BlockSpec((None, block_kv, d), lambda b, hh, i, j: (b, kv_at(i, j), kv_head(hh)))" if k_lanes
              else "pl.BlockSpec((None, None, block_kv, d), lambda b, hh, i, j: (b, kv_head(hh), kv_at(i, j), 0))")
    v_spec = ("pl.BlockSpec((None, block_kv, dv), lambda b, hh, i, j: (b, kv_at(i, j), kv_head(hh)))" if v_lanes
              else "pl.BlockSpec((None, None, block_kv, dv), lambda b, hh, i, j: (b, kv_head(hh), kv_at(i, j), 0))")
    o_spec = ("pl.BlockSpec((None, block_q, hb * dv), lambda b, hh, i, j: (b, q_at(i, j), hh))" if o_lanes
              else "pl.BlockSpec((None, hb, block_q, dv), lambda b, hh, i, j: (b, hh, q_at(i, j), 0))")
    o_shape = "(batch, seq, heads * dv)" if o_lanes else "(batch, heads, seq, dv)"
    bias_prepare = (_sizes("bias", f"a{spec.bias}", spec.bias_order, ("b", "h", "q", "k"))
                    + _prepare("bias", f"a{spec.bias}", spec.bias_order, ("b", "h", "q", "k"))) if bias else ""
    bias_in_spec = f", {_bias_spec(spec.bias_order)}" if bias else ""
    bias_bytes = " + bias.size * bias.dtype.itemsize * (batch if bias_sizes[0] == 1 else 1)" if bias else ""
    halve = 2 if spec.causal else 1
    grid = "(batch, heads // hb, (n_q + 1) // 2, n_q + 1)" if paired else "(batch, heads // hb, n_q, n_kv)"
    sums = (_ONES_SUM if spec.v_dim % 128 == 0 else _VPU_SUM).format(cast=cast)
    score_lines = "\n".join(_score_lines(spec))
    header = header.replace("import jax\n", "import functools\n\nimport jax\n", 1)
    return header + tunable_text + f'''
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


{_PAIRED if paired else _RECTANGLE}

def _rows_from_lanes(ref, hb, d):
    """A (block_q, hb x d) block read in place -> (hb x block_q, d): heads side by side on the lanes, as rows."""
    if hb == 1:
        return ref[...]
    return jnp.concatenate([ref[:, h * d:(h + 1) * d] for h in range(hb)], axis=0)


def _stacked_bias(ref, hb, block_q, block_kv):
    """The bias tile for hb heads stacked as rows, broadcast along its size-1 axes."""
    tile = jnp.broadcast_to(ref[...].astype(jnp.float32), (hb, block_q, block_kv))
    return tile.reshape(hb * block_q, block_kv)


def _causal_mask(s, *, block_q, offset):
    """Keys after the query masked; the rows are hb heads' block_q queries stacked, `offset` is the first query's
    position minus the first key's."""
    rows = lax.rem(lax.broadcasted_iota(jnp.int32, (s.shape[0], 1), 0), block_q) + offset
    cols = lax.broadcasted_iota(jnp.int32, (1, s.shape[1]), 1)
    return jnp.where(rows >= cols, s, MASK_VALUE)


def _kernel(q_ref, k_ref, v_ref, {"bias_ref, " if bias else ""}o_ref, m_ref, l_ref, acc_ref, *, block_q, block_kv, hb,
            d, dv, n_q):
    i, j = pl.program_id(2), pl.program_id(3)
    qi, kv = _positions(i, j, n_q)

    @pl.when(_starts(i, j, qi, kv))
    def _init():
        m_ref[...] = jnp.full_like(m_ref, MASK_VALUE)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    q = {q_read}  # [hb * block_q, d]: the query heads of one K/V head, stacked as rows
    dims = (((1,), (0,)), ((), ())) if TRANSPOSE_K else (((1,), (1,)), ((), ()))
    s = lax.dot_general(q, k_ref[...], dims, preferred_element_type=jnp.float32)  # [hb * block_q, block_kv]
{score_lines}
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
    p = jnp.exp(s - m_new)
    alpha = jnp.exp(m_prev - m_new)
{sums}    m_ref[...] = m_new

    @pl.when(_ends(i, j, qi, kv))
    def _store():
        out = acc_ref[...] / l_ref[...]  # [hb * block_q, dv]
{store}


def _block(dim, want):
    """All of the sequence when it fits, else the largest multiple of 128 up to `want` that divides it."""
    if dim <= want:
        return dim
    b = max(128, want - want % 128)
    while b > 128 and dim % b:
        b -= 128
    return b


def computation({args}):
{_sizes("q", f"a{spec.q}", spec.q_order, ROLES)}{_sizes("k", f"a{spec.k}", spec.k_order, ROLES)}\
{_sizes("v", f"a{spec.v}", spec.v_order, ROLES)}{_prepare("q", f"a{spec.q}", spec.q_order, ROLES, q_lanes)}\
{_prepare("v", f"a{spec.v}", spec.v_order, ROLES, v_lanes)}{bias_prepare}    batch, heads, seq, d = q_sizes
    kv_heads, kv_seq, dv = k_sizes[1], k_sizes[2], v_sizes[3]
    group = heads // kv_heads
    hb = HEADS_PER_STEP if group % HEADS_PER_STEP == 0 else 1
    block_q = _block(seq, BLOCK_Q)
    block_kv = {"block_q" if paired else "_block(kv_seq, BLOCK_KV)"}
    if seq % block_q or kv_seq % block_kv:
        raise ValueError(f"sequence lengths {{seq}}, {{kv_seq}} are not multiples of 128")
    n_q, n_kv = seq // block_q, kv_seq // block_kv

    def q_at(i, j):
        return _positions(i, j, n_q)[0]

    def kv_at(i, j):
        return _positions(i, j, n_q)[1]

    def kv_head(hh):
        return lax.div(hh * hb, group)

    if TRANSPOSE_K:
{_prepare("k", f"a{spec.k}", spec.k_order, ("b", "h", "d", "s"), indent="        ")}\
        k_spec = pl.BlockSpec((None, None, d, block_kv), lambda b, hh, i, j: (b, kv_head(hh), 0, kv_at(i, j)))
    else:
{_prepare("k", f"a{spec.k}", spec.k_order, ROLES, k_lanes, indent="        ")}\
        k_spec = {k_spec}

    def kernel(*refs):
        return _kernel(*refs, block_q=block_q, block_kv=block_kv, hb=hb, d=d, dv=dv, n_q=n_q)

    out = pl.pallas_call(
        kernel,
        grid={grid},
        in_specs=[{q_spec}, k_spec,
                  {v_spec}{bias_in_spec}],
        out_specs={o_spec},
        out_shape=jax.ShapeDtypeStruct({o_shape}, jnp.{spec.out_dtype}),
        scratch_shapes=[pltpu.VMEM((hb * block_q, 1), jnp.float32), pltpu.VMEM((hb * block_q, 1), jnp.float32),
                        pltpu.VMEM((hb * block_q, dv), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=2 * batch * heads * seq * kv_seq * (d + dv) // {halve},
            transcendentals=batch * heads * seq * kv_seq // {halve},
            bytes_accessed=(q.size + (k.size + v.size) * n_q * (heads // hb) // kv_heads // {halve})
            * q.dtype.itemsize + batch * heads * seq * dv * {itemsize(spec.out_dtype)}{bias_bytes}),
    )(q, k, v{", bias" if bias else ""})
{_finish(spec, o_lanes)}
'''
