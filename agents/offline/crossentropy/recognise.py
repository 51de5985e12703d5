"""Recognising cross-entropy: a row max of the logits, the exponential of the logits minus it summed along the row
and its log, and the label's logit (or log-probability) picked - by a gather, or by a one-hot made from an iota
times the row, summed. The ops between the logits and those per-row values are matched one by one; what the
reference does with the per-row values after is evaluated with numpy on drawn values (agents.offline.positions)
and must be the loss per row, its mean or its sum.

A program without one row max over an integer-labelled [rows, vocabulary] value is of another kind (None); one of
this kind that the kernel cannot serve gets a NotRecognised that says what differs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.offline.crossentropy.family import CrossEntropy
from agents.offline.expr import FLOAT_DTYPES, NotRecognised
from agents.offline.positions import is_zero, position_value
from agents.offline.program import CASTS, Op, Program, Value

_CASTS = CASTS + ("stop_gradient", "reduce_precision")
_PASS = _CASTS + ("broadcast_in_dim", "reshape", "squeeze", "expand_dims")


def _is(a: Any, b: Value) -> bool:
    return isinstance(a, Value) and a.id == b.id


def _root(program: Program, arg: Any) -> Any:
    """`arg` traced back through casts, broadcasts and reshapes, and the guards jax.nn puts on a row max: a max
    with -inf, and 0 where the max is not finite (a row of -inf only)."""
    while isinstance(arg, Value) and (op := program.producer(arg)) is not None:
        if op.prim in _PASS:
            arg = op.args[0]
            continue
        if op.prim == "select_n" and len(op.args) == 3 and is_zero(program, op.args[1]):
            check = program.producer(op.args[0]) if isinstance(op.args[0], Value) else None
            if check is not None and check.prim == "is_finite" and _is(_root(program, check.args[0]),
                                                                        _root(program, op.args[2])):
                arg = op.args[2]
                continue
        if op.prim == "max" and len(op.args) == 2:
            consts = [position_value(program, a) for a in op.args]
            guarded = [other for c, other in ((consts[0], op.args[1]), (consts[1], op.args[0]))
                       if c is not None and c.size == 1 and np.isneginf(float(c.reshape(())))]
            if guarded:
                arg = guarded[0]
                continue
        break
    return arg


def _single_user(program: Program, value: Value, prim: str, what: str) -> Op:
    """The one op of kind `prim` `value` reaches through casts, regroupings and an absolute value (of a sum of
    exponentials: the same), past users whose results go nowhere (the sign jax.nn.logsumexp computes)."""
    while True:
        users = [op for op in program.users(value) if program.users(op.out) or op.out in program.outputs]
        if len(users) == 1 and users[0].prim in _PASS + ("abs",):
            value = users[0].out
            continue
        if len(users) == 1 and users[0].prim == prim:
            return users[0]
        raise NotRecognised(f"cross-entropy's {what} goes elsewhere than a {prim}")


def _logits(program: Program, x: Value) -> tuple[int | None, int | None, int | None, bool, int]:
    """Where the logits come from: an input's position, or the matmul's rows and weight (and whether the weight
    is (vocabulary x model)), with the contraction's size."""
    if any(_is(x, v) for v in program.inputs):
        return program.inputs.index(x), None, None, False, 0
    dot = program.producer(x)
    if dot is None or dot.prim != "dot_general":
        raise NotRecognised("cross-entropy's logits are neither an input nor one matmul's output")
    a, b = (program.behind(arg, _CASTS)[0] for arg in dot.args)
    if not all(any(_is(arg, v) for v in program.inputs) for arg in (a, b)):
        raise NotRecognised("cross-entropy's matmul operands are computed inside the reference (a prologue)")
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    if tuple(lb) or tuple(rb) or len(a.shape) != 2 or len(b.shape) != 2 or tuple(lc) != (1,) \
            or tuple(rc) not in ((0,), (1,)):
        raise NotRecognised("cross-entropy's logits are not a (rows x model) @ (model x vocabulary) matmul")
    return None, program.inputs.index(a), program.inputs.index(b), tuple(rc) == (1,), a.shape[1]


def _one_hot(program: Program, side: Any, labels: Value, vocab: int) -> bool:
    """Whether `side` is the labels compared with the vocabulary's positions (an iota), cast."""
    eq = program.producer(program.behind(side, _CASTS)[0])
    if eq is None or eq.prim != "eq" or len(eq.args) != 2:
        return False
    for lab, other in ((eq.args[0], eq.args[1]), (eq.args[1], eq.args[0])):
        positions = position_value(program, other)
        if _is(_root(program, lab), labels) and positions is not None and positions.size == vocab \
                and np.array_equal(positions.reshape(-1), np.arange(vocab)) and positions.shape[-1] == vocab:
            return True
    return False


def _picks(program: Program, x: Value, shifted: Value, log: Value, labels: Value, total: Op
           ) -> list[tuple[Value, str, str]]:
    """Each per-row value picked at the label, how ("gather" or "one_hot"), and what it picks: the logit ("x") or
    the log-probability ("logp", the shifted logits minus the log)."""
    rows, vocab = x.shape
    found: list[tuple[Value, str, str]] = []
    for op in program.ops:
        if op.prim == "gather" and _is(_root(program, op.args[0]), x):
            # Labels that hit every kind of position, a negative one among them (counted from the end, as jnp's
            # indexing does).
            drawn = (np.arange(rows) * 7919) % vocab - (np.arange(rows) % 2) * vocab
            index = position_value(program, op.args[1], given={labels.id: drawn.astype(np.int32)})
            if index is None or index.size != rows or not np.array_equal(index.reshape(-1), drawn % vocab):
                raise NotRecognised("cross-entropy gathers at other positions than the labels (negative ones "
                                    "counted from the end)")
            found.append((op.out, "gather", "x"))
        elif op.prim == "reduce_sum" and op is not total and tuple(op.params["axes"]) == (1,):
            product = program.producer(program.behind(op.args[0], _CASTS)[0])
            if product is None or product.prim != "mul" or len(product.args) != 2:
                continue
            for hot, picked in ((product.args[0], product.args[1]), (product.args[1], product.args[0])):
                if not _one_hot(program, hot, labels, vocab):
                    continue
                source = program.behind(picked, _CASTS)[0]
                minus = program.producer(source) if isinstance(source, Value) else None
                if _is(_root(program, source), x):
                    found.append((op.out, "one_hot", "x"))
                elif minus is not None and minus.prim == "sub" \
                        and _is(program.behind(minus.args[0], _CASTS)[0], shifted) \
                        and _is(_root(program, minus.args[1]), log):
                    found.append((op.out, "one_hot", "logp"))
                else:
                    raise NotRecognised("cross-entropy picks at the label something other than the logit or the "
                                        "log-probability")
    return found


def _reduction(program: Program, output: Value, leaves: dict[str, Value], kinds: list[tuple[Value, str, str]],
               rows: int) -> str:
    """How the output follows from the per-row values: the loss per row ("none"), its mean or its sum; checked by
    evaluating what the reference does after them on drawn values."""
    rng = np.random.default_rng(0)
    m, lse, px = (rng.normal(size=rows).astype(np.float64) * scale for scale in (3.0, 1.0, 3.0))
    given = {leaves["max"].id: m.reshape(leaves["max"].shape), leaves["log"].id: lse.reshape(leaves["log"].shape)}
    for value, _, kind in kinds:
        given[value.id] = (px if kind == "x" else px - m - lse).reshape(value.shape)
    out = position_value(program, output, given=given)
    loss = lse + m - px
    if out is None:
        raise NotRecognised("cross-entropy's per-row values go through more than the offline brain evaluates "
                            "(signs, sums, means) on their way to the output")
    out = np.asarray(out, np.float64)
    for reduce, want in (("none", loss), ("mean", np.asarray(loss.mean())), ("sum", np.asarray(loss.sum()))):
        if out.size == want.size and np.allclose(out.reshape(-1), want.reshape(-1), rtol=1e-5, atol=1e-6):
            return reduce
    raise NotRecognised("the reference's output is not the cross-entropy per row, its mean or its sum")


def recognise_cross_entropy(program: Program, output: Value) -> CrossEntropy | None:
    maxes = [op for op in program.ops if op.prim == "reduce_max"]
    if len(maxes) != 1 or tuple(maxes[0].params["axes"]) != (1,):
        return None
    mx = maxes[0]
    x = _root(program, mx.args[0])
    if not isinstance(x, Value) or len(x.shape) != 2:
        return None
    rows, vocab = x.shape
    labels = [v for v in program.inputs if v.dtype.startswith(("int", "uint")) and tuple(v.shape) == (rows,)]
    exps = [op for op in program.ops if op.prim == "exp"]
    if len(labels) != 1 or len(exps) != 1:
        return None
    shifted = program.behind(exps[0].args[0], _CASTS)[0]
    minus = program.producer(shifted) if isinstance(shifted, Value) else None
    if minus is None or minus.prim != "sub" or not _is(_root(program, minus.args[0]), x) \
            or not _is(_root(program, minus.args[1]), mx.out):
        return None  # a row max, but no softmax's exponential of the logits minus it
    total = _single_user(program, exps[0].out, "reduce_sum", "exponential")
    if tuple(total.params["axes"]) != (1,):
        raise NotRecognised("cross-entropy sums its exponentials along another axis than the vocabulary")
    log = _single_user(program, total.out, "log", "sum of exponentials")
    kinds = _picks(program, x, shifted, log.out, labels[0], total)
    if not kinds:
        raise NotRecognised("a log-softmax without the label's value picked (a gather or a one-hot from an iota): "
                            "the offline brain writes cross-entropy losses")
    if len(kinds) > 1:
        raise NotRecognised("cross-entropy picks at the label more than once")
    reduce = _reduction(program, output, {"max": mx.out, "log": log.out}, kinds, rows)
    logits, hidden, weight, transposed, model = _logits(program, x)
    dtype = program.inputs[logits if logits is not None else hidden].dtype  # type: ignore[index]
    if dtype not in FLOAT_DTYPES:
        raise NotRecognised(f"cross-entropy over {dtype} logits; the offline brain writes floating-point kernels")
    return CrossEntropy(labels=program.inputs.index(labels[0]), logits=logits, hidden=hidden, weight=weight,
                        weight_transposed=transposed, rows=rows, vocab=vocab, model=model, dtype=dtype,
                        reduce=reduce, by=kinds[0][1], picked=kinds[0][2], out_dtype=output.dtype,
                        n_inputs=len(program.inputs), n_static=len(program.static))
