"""What a reference does after the value a kernel writes, as XLA ops on whole arrays: the tail.

A reference may end with work no kernel block can hold - a per-row result broadcast against a per-channel bias
into a new layout, say. The kernel then writes the last value it can (per element or per row) and the written
module finishes the rest with jnp/lax calls, op for op as the reference has them (same dtypes, same
broadcasting). Sizes in the ops' parameters are written as the wrapper's own sizes (`m`, `n`, an input's
`.shape[j]`) where one has that value, so the module serves other shapes too.
"""

from __future__ import annotations

import math

import numpy as np

from agents.offline.expr import BINARY, FLOAT_DTYPES, REDUCE, UNARY, literal, unsupported
from agents.offline.program import Arg, Op, Program, Value

# What a tail may hold: layout, elementwise and reduction ops, and further matmuls (a gated MLP's second and
# third: XLA runs them as the reference does); no gathers or loops.
TAIL_PRIMS = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "convert_element_type",
                        "integer_pow", "select_n", "clamp", "dot_general"}) | frozenset(UNARY) | frozenset(BINARY) \
    | frozenset(REDUCE) | frozenset({"reduce_window_max", "reduce_window_min", "reduce_window_sum"})
_WINDOW = {"reduce_window_max": ("-jnp.inf", "lax.max"), "reduce_window_min": ("jnp.inf", "lax.min"),
           "reduce_window_sum": ("0", "lax.add")}  # a window pool's identity and combiner


def tail_inputs(program: Program, tail: list[Op]) -> set[int]:
    """The ids of the inputs only the tail reads (the kernel need not see them)."""
    ids = {op.out.id for op in tail}
    used = {a.id for op in tail for a in op.args if isinstance(a, Value)} - ids
    return {v.id for v in program.inputs if v.id in used and all(u in tail for u in program.users(v))}


def splits(program: Program, ops: list[Op], output: Value) -> list[tuple[list[Op], Value, list[Op]]]:
    """Ways to end a kernel early: (the ops it computes, the value it writes, the tail), the shortest tail first.
    A split is valid when the tail reads nothing the kernel computed but that value."""
    out = []
    for cut in range(len(ops) - 2, -1, -1):
        head, rest = ops[:cut + 1], ops[cut + 1:]
        made = {op.out.id for op in head}
        read = {a.id for op in rest for a in op.args if isinstance(a, Value)}
        if read & made == {head[-1].out.id} and rest[-1].out.id == output.id:
            out.append((head, head[-1].out, rest))
    return out


def _dimension_numbers(dims: object) -> str:
    (lc, rc), (lb, rb) = dims  # type: ignore[misc]
    return f"(({tuple(lc)}, {tuple(rc)}), ({tuple(lb)}, {tuple(rb)}))"


def _precision(precision: object) -> str:
    """The reference's precision as code (None, one Precision, or one per operand)."""
    def one(p: object) -> str:
        return "None" if p is None else f"lax.Precision.{str(p).rsplit('.', 1)[-1]}"
    if isinstance(precision, tuple | list):
        return "(" + ", ".join(one(p) for p in precision) + ")"
    return one(precision)


def _rounds_on_tpu(op: Op) -> bool:
    """A dot XLA runs with bf16 operands on the TPU: f32 operands at the default precision."""
    precision = op.params.get("precision")
    parts = precision if isinstance(precision, tuple | list) else (precision,)
    default = all(p is None or str(p).endswith("DEFAULT") for p in parts)
    return default and all(isinstance(a, Value) and a.dtype == "float32" for a in op.args[:2])


def _dtype_or_none(dtype: object) -> str:
    return "None" if dtype is None else f"jnp.{dtype}"


def wrapper_tail(tail: tuple[Op, ...], written: Value, inputs: tuple[Value, ...],
                 own_sizes: tuple[tuple[int, str], ...]) -> tuple[list[str], str]:
    """The tail's lines in a written module's wrapper, where the kernel's value is `out` and the inputs are `a0`,
    `a1`, ...: sizes named by the wrapper's own variables (`own_sizes`, first wins) before the inputs' shapes."""
    sizes: dict[int, str] = {}
    for size, name in own_sizes:
        sizes.setdefault(size, name)
    for i, value in enumerate(inputs):
        for j, d in enumerate(value.shape):
            sizes.setdefault(d, f"a{i}.shape[{j}]")
    names = {written.id: "out"} | {v.id: f"a{i}" for i, v in enumerate(inputs)}
    return tail_lines(tail, names, sizes)


def tail_lines(tail: tuple[Op, ...], names: dict[int, str], sizes: dict[int, str]) -> tuple[list[str], str]:
    """The wrapper's lines computing the tail, and the name of its result. `names`: the expressions of the values
    it starts from (the kernel's result, the inputs); `sizes`: size -> the wrapper's expression for it."""
    names = dict(names)
    lines = []

    def ref(arg: Arg) -> str:
        if isinstance(arg, Value):
            return names[arg.id]
        # A mean divides by a size (or multiplies by its reciprocal): keep it the wrapper's size.
        if isinstance(arg, float) and arg > 1 and arg.is_integer() and int(arg) in sizes:
            return f"float({sizes[int(arg)]})"
        recip = next((n for n in sizes if n > 1 and isinstance(arg, float) and math.isclose(arg, 1.0 / n,
                                                                                           rel_tol=1e-6)), None)
        return f"(1.0 / {sizes[recip]})" if recip else literal(arg)

    def shape(dims: tuple[int, ...]) -> str:
        return "(" + "".join(f"{sizes.get(int(d), str(int(d)))}, " for d in dims) + ")"

    for op in tail:
        x = ref(op.args[0]) if op.args else ""
        p = op.params
        if op.prim == "broadcast_in_dim":
            expr = f"lax.broadcast_in_dim({x}, {shape(p['shape'])}, {tuple(p['broadcast_dimensions'])})"
        elif op.prim == "reshape":
            expr = f"jnp.reshape({x}, {shape(p['new_sizes'])})"
        elif op.prim == "squeeze":
            expr = f"lax.squeeze({x}, {tuple(p['dimensions'])})"
        elif op.prim == "expand_dims":
            expr = f"lax.expand_dims({x}, {tuple(p['dimensions'])})"
        elif op.prim == "transpose":
            expr = f"jnp.transpose({x}, {tuple(p['permutation'])})"
        elif op.prim == "convert_element_type":
            new = str(p["new_dtype"])
            # lax's, not .astype: the operand may be a literal (a where's 0, converted)
            expr = f"lax.convert_element_type({x}, jnp.{new})" if new in FLOAT_DTYPES or new in ("int32", "bool") \
                else f"lax.convert_element_type({x}, jnp.dtype('{new}'))"
        elif op.prim in UNARY:
            expr = UNARY[op.prim].format(x)
        elif op.prim == "integer_pow":
            expr = f"lax.integer_pow({x}, {int(p['y'])})"
        elif op.prim in BINARY:
            expr = BINARY[op.prim].format(x, ref(op.args[1]))
        elif op.prim == "select_n" and len(op.args) == 3:
            expr = f"jnp.where({x}, {ref(op.args[2])}, {ref(op.args[1])})"
        elif op.prim == "clamp":
            expr = f"jnp.clip({ref(op.args[1])}, {x}, {ref(op.args[2])})"
        elif op.prim == "dot_general" and _rounds_on_tpu(op):
            # As XLA computes a default-precision f32 dot on the TPU: bf16 operands, f32 accumulation. Written
            # out, so the module computes the same wherever it runs (the CPU would multiply in full f32).
            expr = (f"lax.dot_general({x}.astype(jnp.bfloat16), {ref(op.args[1])}.astype(jnp.bfloat16), "
                    f"{_dimension_numbers(p['dimension_numbers'])}, preferred_element_type=jnp.float32)"
                    f".astype(jnp.{op.out.dtype})")
        elif op.prim == "dot_general":
            expr = (f"lax.dot_general({x}, {ref(op.args[1])}, {_dimension_numbers(p['dimension_numbers'])}, "
                    f"precision={_precision(p.get('precision'))}, "
                    f"preferred_element_type={_dtype_or_none(p.get('preferred_element_type'))})")
        elif op.prim in _WINDOW:
            init, combine = _WINDOW[op.prim]
            expr = (f"lax.reduce_window({x}, jnp.array({init}, {x}.dtype), {combine}, "
                    f"{tuple(p['window_dimensions'])}, {tuple(p['window_strides'])}, "
                    f"{tuple(tuple(q) for q in p['padding'])}, {tuple(p['base_dilation'])}, "
                    f"{tuple(p['window_dilation'])})")
        elif op.prim == "top_k" and int(p.get("axis", -1)) in (-1, len(op.args[0].shape) - 1):
            expr = f"lax.top_k({x}, {int(p['k'])})[{int(p['result'])}]"
        elif op.prim == "iota":
            expr = (f"lax.broadcasted_iota(jnp.{np.dtype(p['dtype']).name}, {shape(p['shape'])}, "
                    f"{int(p['dimension'])})")
        elif op.prim in REDUCE:
            expr = f"{REDUCE[op.prim]}({x}, axis={tuple(p['axes'])})"
        else:
            raise unsupported(op.prim, "the reference's last steps")
        name = f"t{op.out.id}"
        lines.append(f"{name} = {expr}")
        names[op.out.id] = name
    return lines, names[tail[-1].out.id]
