"""Constant and position-made values, evaluated with numpy at the production shapes: a scale the reference
computes (1 / jnp.sqrt(d)), and masks built from positions: what an attention reference's iota-made mask
(or a constant it baked in) keeps, compared with the causal mask the kernel writes.

A mask is checked by its numbers because its spelling varies (tril, iota compares, where chains, an additive
-inf array) and because a small check shape cannot tell a sliding window or a block pattern from causal: the
window only shows at sequence lengths longer than itself. Arrays stay broadcastable (unit axes where the program
broadcasts), so a [q, k] mask costs q x k booleans whatever the batch and heads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from agents.offline.program import Program, Value

LIMIT = 1 << 26  # the most elements one evaluated array may have; past it the mask is not evaluated

_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
           "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
           "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or, "div": np.true_divide,
           "rem": np.remainder, "pow": np.power}
_UNARY = {"not": np.logical_not, "neg": np.negative, "abs": np.abs, "sqrt": np.sqrt,
          "rsqrt": lambda a: 1.0 / np.sqrt(a), "exp": np.exp, "log": np.log, "is_finite": np.isfinite,
          "sign": np.sign}


def _dtype(name: Any) -> Any:
    text = str(np.dtype(name)) if not str(name).startswith("bfloat16") else "bfloat16"
    return np.float32 if text in ("bfloat16", "float16") else np.dtype(text)


def position_value(program: Program, arg: Any, *, depth: int = 0,
                   given: dict[int, np.ndarray] | None = None) -> np.ndarray | None:
    """The value of an expression computed from positions and constants alone (iota, literals), and from the
    values `given` by id (a family's check of what follows its reductions), or None when it reads anything else,
    uses an op not listed here, or grows past LIMIT elements."""
    if isinstance(arg, bool | int | float):
        return np.asarray(arg)
    if not isinstance(arg, Value) or depth > 64:
        return None
    if given is not None and arg.id in given:
        return given[arg.id]
    op = program.producer(arg)
    if op is None:
        return None
    if op.prim == "iota":
        shape, axis = tuple(op.params["shape"]), int(op.params["dimension"])
        unit = [1] * len(shape)
        unit[axis] = shape[axis]
        return np.arange(shape[axis], dtype=_dtype(op.params["dtype"])).reshape(unit)
    args = [position_value(program, a, depth=depth + 1, given=given) for a in op.args]
    if any(a is None for a in args):
        return None
    out: np.ndarray
    if op.prim == "broadcast_in_dim":
        x = args[0]
        assert x is not None
        unit = [1] * len(op.out.shape)
        for i, d in enumerate(op.params["broadcast_dimensions"]):
            unit[d] = x.shape[i]
        out = x.reshape(unit)
    elif op.prim in ("reshape", "squeeze", "expand_dims", "transpose"):
        source = op.args[0]
        if not isinstance(source, Value) or source.size > LIMIT:
            return None
        x = np.broadcast_to(args[0], source.shape)
        out = np.transpose(x, op.params["permutation"]) if op.prim == "transpose" else x.reshape(op.out.shape)
    elif op.prim == "concatenate":
        parts = [np.broadcast_to(a, v.shape) for a, v in zip(args, op.args, strict=True)  # type: ignore[union-attr]
                 if isinstance(v, Value)]
        if len(parts) != len(op.args):
            return None
        out = np.concatenate(parts, axis=int(op.params["dimension"]))
    elif op.prim == "convert_element_type":
        out = np.asarray(args[0]).astype(_dtype(op.params["new_dtype"]))
    elif op.prim == "select_n" and len(args) == 3:
        out = np.where(np.asarray(args[0]).astype(bool), args[2], args[1])  # type: ignore[arg-type]
    elif op.prim in _BINARY and len(args) == 2:
        with np.errstate(all="ignore"):
            out = _BINARY[op.prim](args[0], args[1])
    elif op.prim in _UNARY and len(args) == 1:
        with np.errstate(all="ignore"):
            out = _UNARY[op.prim](args[0])
    elif op.prim in ("reduce_sum", "reduce_max") and len(args) == 1:
        x = np.broadcast_to(args[0], op.args[0].shape)  # type: ignore[union-attr]
        reduce = np.sum if op.prim == "reduce_sum" else np.max
        out = reduce(x, axis=tuple(op.params["axes"]))
    elif op.prim == "stop_gradient" and len(args) == 1:
        out = np.asarray(args[0])
    elif op.prim == "integer_pow" and len(args) == 1:
        y = int(op.params["y"])
        out = np.float_power(args[0], y) if y < 0 else np.power(args[0], y)
    else:
        return None
    out = np.asarray(out)
    return out if out.size <= LIMIT else None


def is_zero(program: Program, arg: Any) -> bool:
    """Whether `arg` is the constant 0 (a literal, or a scalar made from literals and broadcast)."""
    value = position_value(program, arg)
    return value is not None and value.size == 1 and float(value.reshape(())) == 0.0


def kept_by_additive(value: np.ndarray) -> np.ndarray | None:
    """Where an additive mask keeps the score (adds 0); None when it adds anything but 0 and a hugely negative
    number (a position-dependent bias, not a mask)."""
    kept = value == 0
    masked = value <= -1e9
    return kept if bool(np.all(kept | masked)) else None


def causal_mismatch(kept: np.ndarray, score_shape: tuple[int, ...], q_axis: int, k_axis: int) -> str | None:
    """None when `kept` (broadcastable to the scores) keeps exactly the keys at or before each query, the same
    for every batch and head; else what it keeps instead, in words. An array too large to compare is not
    judged (None): the numbers check on small inputs is what stands then."""
    kept = np.asarray(kept).astype(bool)
    kept = kept.reshape((1,) * (len(score_shape) - kept.ndim) + kept.shape)
    for axis in range(kept.ndim):
        if axis not in (q_axis, k_axis) and kept.shape[axis] > 1:
            first = np.take(kept, [0], axis=axis)
            if not np.array_equal(np.broadcast_to(first, kept.shape), kept):
                return "a mask that differs between heads or batch entries"
    index = tuple(slice(None) if a in (q_axis, k_axis) else 0 for a in range(kept.ndim))
    plane = kept[index]
    if q_axis > k_axis:
        plane = plane.T
    n_q, n_k = score_shape[q_axis], score_shape[k_axis]
    if n_q * n_k > LIMIT:
        return None
    plane = np.broadcast_to(plane, (n_q, n_k))
    distance = np.arange(n_q)[:, None] - np.arange(n_k)[None, :]  # query position minus key position
    if np.array_equal(plane, distance >= 0):
        return None
    if bool(np.all(distance[plane] >= 0)) and plane.any():
        window = int(distance[plane].max()) + 1
        if np.array_equal(plane, (distance >= 0) & (distance < window)):
            return f"a sliding window of {window} keys"
    return "a pattern other than causal (keys at or before the query)"
