"""Run a reference on the CPU as a TPU computes it, or as exactly as float64 allows.

`as_on_tpu`: on TPU, XLA multiplies f32 matrices (dot_general, convolutions) with bf16 operands and f32
accumulation unless the program asks for more (`precision=HIGH/HIGHEST`, an f32 dot algorithm, or a higher
default matmul precision); elementwise f32 work stays f32. On the CPU no precision setting changes the result,
so the operands of every default-precision f32 dot and convolution are rounded to bf16 explicitly. A kernel
that computes as XLA does on the TPU is then compared like with like, and one that computes in full f32 is
still within the float64 truth's allowance (see `compare.compare_outputs`).

`widened`: the same program with every floating value, constant and result type widened to float64 - the
truth an honest kernel's rounding is measured against (float32 where float64 would not fit in memory).
Programs written as `lax.*_p.bind` (as `kernelbot port` writes them) fix their dtypes in every equation, so
calling them on float64 inputs does not work; rewriting the program does.

Both walk the traced program equation by equation, with one rule deciding what each equation becomes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core

from tpu_runner.analysis.jaxpr_walk import INLINE_CALLS, closed_jaxpr, iter_eqns, sub_jaxprs
from tpu_runner.analysis.separable import Slicing, same_program, slicings

ROUNDED_PRIMITIVES = frozenset({"dot_general", "conv_general_dilated"})
DTYPE_PARAMS = ("preferred_element_type", "new_dtype", "dtype")


class Rule:
    """How equations are rewritten. `touches` says whether a program has anything to rewrite (else it runs as
    it is); `apply` returns an equation's outputs, or None to bind it with `params` as usual."""

    def touches(self, eqn: Any) -> bool:
        raise NotImplementedError

    def apply(self, eqn: Any, args: Sequence[Any]) -> list[Any] | None:
        raise NotImplementedError

    def params(self, eqn: Any) -> dict[str, Any]:
        return dict(eqn.params)

    def value(self, x: Any) -> Any:
        return x


def _default_precision(precision: Any) -> bool:
    if precision is None:
        return True
    if isinstance(precision, tuple | list):
        return all(p is None or str(p).endswith("DEFAULT") for p in precision)
    return str(precision).endswith("DEFAULT")


class _AsOnTpu(Rule):
    def touches(self, eqn: Any) -> bool:
        """A default-precision f32 dot or convolution: bf16 operands on the TPU."""
        if eqn.primitive.name not in ROUNDED_PRIMITIVES or not _default_precision(eqn.params.get("precision")):
            return False
        configured = str(jax.config.jax_default_matmul_precision or "default").lower()
        if configured not in ("default", "bfloat16", "fastest"):
            return False
        return all(getattr(v.aval, "dtype", None) == jnp.float32 for v in eqn.invars)

    def apply(self, eqn: Any, args: Sequence[Any]) -> list[Any] | None:
        if not self.touches(eqn):
            return None
        operands = [x.astype(jnp.bfloat16) for x in args]
        out = eqn.primitive.bind(*operands, **dict(eqn.params, preferred_element_type=jnp.float32))
        return [out.astype(eqn.outvars[0].aval.dtype)]


def _floating(dtype: Any) -> bool:
    try:
        return bool(jnp.issubdtype(dtype, jnp.floating))
    except TypeError:
        return False


class _Widened(Rule):
    """Every floating value and type as `dtype` (float64: the truth; float32 where float64 would not fit)."""

    def __init__(self, dtype: Any = np.float64):
        self.dtype = np.dtype(dtype)

    def touches(self, eqn: Any) -> bool:
        return True

    def apply(self, eqn: Any, args: Sequence[Any]) -> list[Any] | None:
        return None

    def params(self, eqn: Any) -> dict[str, Any]:
        params = dict(eqn.params)
        for key in DTYPE_PARAMS:
            if key in params and params[key] is not None and _floating(params[key]):
                params[key] = self.dtype
        return params

    def value(self, x: Any) -> Any:
        dtype = getattr(x, "dtype", None)
        if dtype is not None and _floating(dtype) and dtype != self.dtype:
            return x.astype(self.dtype) if hasattr(x, "astype") else self.dtype.type(x)
        if isinstance(x, float):
            return self.dtype.type(x)
        return x


def _touches(jaxpr: Any, rule: Rule) -> bool:
    return any(rule.touches(eqn) for eqn in iter_eqns(jaxpr))


def _rewritten(closed: jex_core.ClosedJaxpr, rule: Rule) -> jex_core.ClosedJaxpr:
    """A control-flow body rewritten by the rule, as a closed jaxpr over its (rewritten) operand types."""
    avals = [jax.ShapeDtypeStruct(a.shape, rule.value(np.zeros((), a.dtype)).dtype
                                  if _floating(a.dtype) else a.dtype) for a in closed.in_avals]
    return jax.make_jaxpr(lambda *xs: evaluate(closed, xs, rule))(*avals)


def _apply(eqn: Any, args: list[Any], rule: Rule) -> list[Any]:
    direct = rule.apply(eqn, args)
    if direct is not None:
        return direct
    key = INLINE_CALLS.get(eqn.primitive.name)
    if key is not None and key in eqn.params and _touches(eqn.params[key], rule):
        return list(evaluate(closed_jaxpr(eqn.params[key]), args, rule))
    params = rule.params(eqn)
    if any(_touches(sub, rule) for value in eqn.params.values() for sub in sub_jaxprs(value)):
        for k, v in eqn.params.items():
            if isinstance(v, jex_core.ClosedJaxpr):
                params[k] = _rewritten(v, rule)
            elif isinstance(v, tuple | list) and v and all(isinstance(x, jex_core.ClosedJaxpr) for x in v):
                params[k] = type(v)(_rewritten(x, rule) for x in v)
    # As jax's own interpreter binds: call-like primitives (custom_jvp_call, as jax.nn.relu is) rebuild their
    # bound form (its `subfuns`) from the equation's params.
    out = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(params))
    return list(out) if eqn.primitive.multiple_results else [out]


def evaluate(closed: jex_core.ClosedJaxpr, args: Sequence[Any], rule: Rule) -> list[Any]:
    jaxpr = closed.jaxpr
    env: dict[Any, Any] = {}

    def read(var: Any) -> Any:
        return rule.value(var.val) if isinstance(var, jex_core.Literal) else env[var]

    for var, value in zip(jaxpr.constvars, closed.consts, strict=True):
        env[var] = rule.value(value)
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = rule.value(value)
    for eqn in jaxpr.eqns:
        outs = _apply(eqn, [read(v) for v in eqn.invars], rule)
        for var, value in zip(eqn.outvars, outs, strict=True):
            env[var] = value
    return [read(v) for v in jaxpr.outvars]


def as_on_tpu(fn: Callable[..., Any], static: Sequence[Any]) -> Callable[..., Any]:
    """`fn(*dynamic, *static)` computed as XLA computes it on a TPU by default (see the module docstring)."""
    rule = _AsOnTpu()

    def run(*dynamic: Any) -> Any:
        closed = jax.make_jaxpr(lambda *d: fn(*d, *static))(*dynamic)
        if not _touches(closed, rule):
            return fn(*dynamic, *static)
        out_tree = jax.tree.structure(jax.eval_shape(lambda *d: fn(*d, *static), *dynamic))
        return jax.tree.unflatten(out_tree, evaluate(closed, dynamic, rule))

    return jax.jit(run)


# What a widened program may take beyond XLA's count of it. The count (arguments, outputs, temporaries) leaves out
# the CPU runtime's own working memory (15p's float64 truth, counted 4 GiB, peaked at 5.5 GiB with JAX 0.12), and
# with JAX 0.10.2 it does not hold at all: 15p's float32 truth, counted 2 GiB, peaked at 10 GiB (its 4 GiB
# [4, 16, 4096, 4096] scores alive in several values at once). So a program needs at least twice its count, and
# at least its arguments and outputs with its largest value three times over.
COUNT_MARGIN = 2
LARGEST_VALUES_ALIVE = 3


def _largest_value(jaxpr: Any, itemsize: int) -> int:
    """Bytes of the program's largest intermediate value with its floats at `itemsize`, nested calls included."""
    largest = 0
    for eqn in iter_eqns(jaxpr):
        for var in eqn.outvars:
            aval = getattr(var, "aval", None)
            shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
            if shape is not None and dtype is not None:
                size = itemsize if _floating(dtype) else np.dtype(dtype).itemsize
                largest = max(largest, int(np.prod(shape, dtype=np.int64)) * size)
    return largest


def widened_program(fn: Callable[..., Any], static: Sequence[Any], dynamic: Sequence[np.ndarray],
                    dtype: Any = np.float64) -> tuple[Callable[[], Any], int]:
    """`fn(*dynamic, *static)` with every floating value and type widened to `dtype` (see the module docstring),
    compiled for this host's CPU but not run: the call that runs it, and the bytes it may need to run (XLA's count
    of its arguments, outputs and temporaries, with the margins above). The program is traced at the inputs' own
    dtypes, then evaluated wide."""
    closed = jax.make_jaxpr(lambda *d: fn(*d, *static))(*dynamic)
    out_tree = jax.tree.structure(jax.eval_shape(lambda *d: fn(*d, *static), *dynamic))
    rule = _Widened(dtype)
    x64 = rule.dtype == np.float64
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])  # a TPU has no float64: always the host's CPU
    with jax.enable_x64(x64):
        avals = [jax.ShapeDtypeStruct(np.shape(x), rule.value(np.zeros((), np.asarray(x).dtype)).dtype,
                                      sharding=cpu) for x in dynamic]
        compiled = jax.jit(lambda *d: evaluate(closed, d, rule)).lower(*avals).compile()
    stats = compiled.memory_analysis()
    ends, temps = (getattr(stats, "argument_size_in_bytes", 0) + getattr(stats, "output_size_in_bytes", 0),
                   getattr(stats, "temp_size_in_bytes", 0)) if stats is not None else (0, 0)
    need = max(COUNT_MARGIN * (ends + temps),
               ends + LARGEST_VALUES_ALIVE * _largest_value(closed, rule.dtype.itemsize))

    def run(inputs: Sequence[np.ndarray] | None = None) -> Any:
        """The program on `dynamic`, or on other inputs of the same shapes and dtypes."""
        with jax.enable_x64(x64):
            wide = [jax.device_put(rule.value(np.asarray(x)), cpu) for x in (dynamic if inputs is None else inputs)]
            return jax.tree.unflatten(out_tree, compiled(*wide))

    return run, int(need)


def _piece(x: np.ndarray, axis: int | None, index: int, pieces: int) -> np.ndarray:
    if axis is None:
        return x
    step = x.shape[axis] // pieces
    return x[(slice(None),) * axis + (slice(index * step, (index + 1) * step),)]


def sliced_widened_program(fn: Callable[..., Any], static: Sequence[Any], dynamic: Sequence[np.ndarray],
                           dtype: Any, room: int, whole_need: int) -> tuple[Callable[[], Any], str] | None:
    """`widened_program` run a slice at a time, for a program too large to run whole in `room` bytes: where it
    computes its outputs independently along an axis of its inputs (`analysis.separable`), in the fewest slices
    one of which fits beside the whole outputs. The call and how it slices, or None where no slicing fits."""
    def traced(inputs: Sequence[Any]) -> Any:
        return jax.make_jaxpr(lambda *d: fn(*d, *static))(*inputs)

    closed = traced(dynamic)
    wide = np.dtype(dtype).itemsize
    out_bytes = sum(int(np.prod(o.shape)) * (wide if _floating(o.dtype) else np.dtype(o.dtype).itemsize)
                    for o in closed.out_avals)
    for slicing in slicings(closed):
        for pieces in (n for n in range(2, slicing.size + 1) if slicing.size % n == 0):
            if whole_need / pieces + out_bytes > room:
                continue  # not even an even share of the whole would fit: not worth compiling
            first = [_piece(x, a, 0, pieces) for x, a in zip(dynamic, slicing.in_axes, strict=True)]
            if not same_program(closed, traced(first), slicing, pieces):
                break  # the reference traces to another program at a slice's shapes: not this slicing
            run_piece, need = widened_program(fn, static, first, dtype)
            if need + out_bytes > room:
                continue

            def run(slicing: Slicing = slicing, pieces: int = pieces, run_piece: Callable[..., Any] = run_piece
                    ) -> Any:
                whole: list[np.ndarray] = []
                tree = None
                for i in range(pieces):
                    part = run_piece([_piece(x, a, i, pieces) for x, a in zip(dynamic, slicing.in_axes, strict=True)])
                    leaves, tree = jax.tree.flatten(part)
                    for j, (leaf, axis) in enumerate(zip(leaves, slicing.out_axes, strict=True)):
                        leaf = np.asarray(leaf)
                        if len(whole) <= j:
                            shape = list(leaf.shape)
                            shape[axis] *= pieces
                            whole.append(np.empty(shape, leaf.dtype))
                        _piece(whole[j], axis, i, pieces)[...] = leaf
                return jax.tree.unflatten(tree, whole)

            return run, f"made in {pieces} slices of {slicing.describe()}"
    return None


def widened(fn: Callable[..., Any], static: Sequence[Any], dynamic: Sequence[np.ndarray],
            dtype: Any = np.float64) -> Any:
    """`fn(*dynamic, *static)` evaluated with every floating value and type widened to `dtype`."""
    return widened_program(fn, static, dynamic, dtype)[0]()
