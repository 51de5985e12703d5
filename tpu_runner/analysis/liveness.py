"""Which elements of each input can reach the outputs at all: the roofline's compulsory traffic.

A reference that masks with a constant predicate (a causal mask built from positions, `jnp.where(causal, s, min)`)
never lets the masked elements of what it selects from reach its outputs: 5p's score bias [heads, seq, seq] is read
only below the diagonal by any correct kernel, so counting all of it as compulsory traffic flagged an honest kernel
that reads it once, below the diagonal, as "faster than physics". The analysis is structural, never by value: only
a `select_n` whose predicate depends on no input kills elements; every other op keeps all of its operands alive
wherever any of its outputs is (elementwise ops, broadcasts, reshapes, transposes and slices keep them element by
element). It runs only where such a select exists and its values are small enough to hold as booleans.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from jax.extend import core as jex_core

from tpu_runner.analysis.jaxpr_walk import closed_jaxpr, inline_body

# Booleans per value at most (64 MiB each): larger programs (5p at its production shape: 4.3G scores) keep whole
# inputs.
MAX_ELEMENTS = 2**26

_ELEMENTWISE = {"add", "sub", "mul", "div", "max", "min", "neg", "exp", "exp2", "log", "log1p", "tanh", "logistic",
                "abs", "sign", "sqrt", "rsqrt", "square", "integer_pow", "pow", "convert_element_type", "erf",
                "expm1", "sin", "cos", "floor", "ceil", "round", "clamp", "copy", "not", "and", "or",
                "eq", "ne", "lt", "le", "gt", "ge", "nextafter", "is_finite", "reduce_precision", "stop_gradient"}
# Ops that only rearrange their first operand's elements: liveness goes back through them element by element.
_RESHAPES = {"reshape", "squeeze"}


def _is_var(v: Any) -> bool:
    return not isinstance(v, jex_core.Literal)


def _constant_select(jaxpr: Any, tainted_in: list[bool]) -> tuple[list[bool], bool]:
    """Which outputs depend on an input, and whether a select with an input-free predicate chooses between
    values of which one does."""
    tainted = {v for v, t in zip(jaxpr.invars, tainted_in, strict=True) if t}
    found = False
    for eqn in jaxpr.eqns:
        ins = [_is_var(v) and v in tainted for v in eqn.invars]
        inner = inline_body(eqn)
        if inner is not None:
            outs, inner_found = _constant_select(getattr(inner, "jaxpr", inner), ins)
            found |= inner_found
            tainted |= {v for v, t in zip(eqn.outvars, outs, strict=True) if t}
            continue
        if eqn.primitive.name == "select_n" and not ins[0] and any(ins[1:]):
            found = True
        if any(ins):
            tainted |= set(eqn.outvars)
    return [_is_var(v) and v in tainted for v in jaxpr.outvars], found


def _size(v: Any) -> int:
    return int(np.prod(getattr(v.aval, "shape", ()), dtype=np.int64))


class _Constants:
    """The values of a jaxpr's input-free vars, computed on demand from its constants (and the values its caller
    knows for its inputs)."""

    def __init__(self, jaxpr: Any, consts: list[Any], known: list[np.ndarray | None]) -> None:
        self.values: dict[Any, Any] = dict(zip(jaxpr.constvars, consts, strict=True))
        self.values.update({v: k for v, k in zip(jaxpr.invars, known, strict=True)})
        self.producer = {v: eqn for eqn in jaxpr.eqns for v in eqn.outvars}

    def constant(self, v: Any) -> np.ndarray | None:
        """The value of an input-free var (computed from the program's constants), or None where it depends on an
        input or cannot be computed."""
        if not _is_var(v):
            return np.asarray(v.val)
        if v in self.values:
            return None if self.values[v] is None else np.asarray(self.values[v])
        eqn = self.producer.get(v)
        value = None
        if eqn is not None:
            args = [self.constant(x) for x in eqn.invars]
            if all(a is not None for a in args):
                inner = inline_body(eqn)
                if inner is not None:
                    outs = jex_core.jaxpr_as_fun(closed_jaxpr(inner))(*args)
                else:
                    outs = eqn.primitive.bind(*args, **eqn.params)
                    outs = outs if eqn.primitive.multiple_results else [outs]
                for out_var, out in zip(eqn.outvars, outs, strict=True):
                    self.values[out_var] = np.asarray(out)
                value = self.values[v]
        self.values.setdefault(v, value)
        return None if value is None else np.asarray(value)


def _collapsed(live: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """An output's liveness folded onto an operand of the same rank that broadcasts along its size-1 axes."""
    for axis, size in enumerate(shape):
        if size == 1 and live.shape[axis] != 1:
            live = live.any(axis=axis, keepdims=True)
    return live.reshape(shape)


def _operand_live(eqn: Any, index: int, out_live: np.ndarray, const: Callable[[Any], np.ndarray | None]
                  ) -> np.ndarray | bool:
    """Which elements of operand `index` reach the live elements of the output (True: all of them)."""
    name, operand = eqn.primitive.name, eqn.invars[index]
    shape = tuple(getattr(operand.aval, "shape", ()))
    if name == "select_n" and index > 0:
        predicate = const(eqn.invars[0])
        if predicate is not None:
            chosen = np.broadcast_to(predicate.astype(np.int32) == index - 1, out_live.shape)
            return out_live & chosen
        return out_live
    if name in _ELEMENTWISE:
        if len(shape) != out_live.ndim:
            return bool(out_live.any())  # a scalar beside arrays
        return _collapsed(out_live, shape)  # along the axes it broadcasts (size 1)
    if name == "broadcast_in_dim":
        dims = eqn.params["broadcast_dimensions"]
        other = tuple(a for a in range(out_live.ndim) if a not in dims)
        return _collapsed(out_live.any(axis=other) if other else out_live, shape)
    if name in _RESHAPES and index == 0:
        return out_live.reshape(shape)
    if name == "transpose":
        return np.transpose(out_live, np.argsort(eqn.params["permutation"]))
    if name == "slice":
        live = np.zeros(shape, bool)
        strides = eqn.params["strides"] or (1,) * len(shape)
        index_ = tuple(slice(s, e, st) for s, e, st in zip(eqn.params["start_indices"], eqn.params["limit_indices"],
                                                           strides, strict=True))
        live[index_] = out_live
        return live
    return bool(out_live.any())


def _backward(jaxpr: Any, consts: list[Any], out_live: list[np.ndarray | bool],
              known: list[np.ndarray | None]) -> list[np.ndarray | bool]:
    """Liveness of the jaxpr's inputs from its outputs' (an array of booleans, or True / False for all / none);
    `known`: the values of its input-free inputs, where the caller knows them."""
    state = _Constants(jaxpr, consts, known)
    live: dict[Any, np.ndarray | bool] = {}

    def add(v: Any, value: np.ndarray | bool) -> None:  # a var read in several places: live where any reads it
        if not _is_var(v) or value is False:
            return
        old = live.get(v, False)
        live[v] = True if old is True or value is True else value if old is False else old | value

    for v, value in zip(jaxpr.outvars, out_live, strict=True):
        add(v, value)
    for eqn in reversed(jaxpr.eqns):
        outs = [live.get(v, False) for v in eqn.outvars]
        if not any(o is True or (not isinstance(o, bool) and o.any()) for o in outs):
            continue
        inner = inline_body(eqn)
        if inner is not None:
            closed = closed_jaxpr(inner)
            known = [state.constant(v) for v in eqn.invars]
            for v, value in zip(eqn.invars, _backward(closed.jaxpr, closed.consts, outs, known), strict=True):
                add(v, value)
            continue
        if len(eqn.outvars) != 1 or any(_size(v) > MAX_ELEMENTS for v in (*eqn.outvars, *eqn.invars) if _is_var(v)):
            for v in eqn.invars:
                add(v, True)
            continue
        out = outs[0]
        out_array = np.broadcast_to(np.asarray(out), tuple(eqn.outvars[0].aval.shape)) if isinstance(out, bool) \
            else out
        for i, v in enumerate(eqn.invars):
            if eqn.primitive.name == "select_n" and i == 0:
                add(v, True)  # the predicate is read wherever any case is chosen
            else:
                add(v, _operand_live(eqn, i, out_array, state.constant))
    return [live.get(v, False) for v in jaxpr.invars]


def read_fractions(closed: Any, used: list[bool]) -> list[float]:
    """Per input, the fraction of its elements that can reach an output (`used`: whether it is read at all);
    1.0 for a read input wherever no constant mask is found or the program is too large to follow."""
    jaxpr = closed.jaxpr
    fractions = [1.0 if u else 0.0 for u in used]
    _, found = _constant_select(jaxpr, [True] * len(jaxpr.invars))
    if not found:
        return fractions
    try:
        live = _backward(jaxpr, list(closed.consts), [True] * len(jaxpr.outvars), [None] * len(jaxpr.invars))
    except Exception:  # noqa: BLE001 - an op this analysis does not follow: every read input counts whole
        return fractions
    return [f if isinstance(value, bool) or not f else float(np.mean(value))
            for f, value in zip(fractions, live, strict=True)]
