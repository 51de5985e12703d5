"""What a reference does after the value a kernel writes, as XLA ops on whole arrays: the tail.

A reference may end with work no kernel block can hold - a per-row result broadcast against a per-channel bias
into a new layout, say. The kernel then writes the last value it can (per element or per row) and the written
module finishes the rest with jnp/lax calls, op for op as the reference has them (same dtypes, same
broadcasting). Sizes in the ops' parameters are named where they come from (the same axis of a value the tail
reads: `out.shape[2]`, an input's `.shape[j]`; a mean's divisor as the count its sum reduced), and only a size with
no such source by the wrapper's own size of that value (`m`, `n`), so the module serves other shapes too.
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
    it starts from (the kernel's result, the inputs); `sizes`: size -> the wrapper's expression for it.

    A size is named where it comes from - the same axis of a value the tail reads, a mean's divisor the count its
    sum reduced - so the module is right at other shapes too, where sizes that were equal here differ. Only a size
    with no such source is named by its value (`sizes`, then the literal)."""
    names = dict(names)
    lines = []
    dims: dict[int, tuple[str | None, ...]] = {}  # per value: each axis's size as the wrapper's expression
    counts: dict[int, tuple[int, str]] = {}  # per value: the elements its last reduction summed, and their expression

    def axes(v: Value) -> tuple[str | None, ...]:
        if v.id not in dims:
            dims[v.id] = tuple(f"{names[v.id]}.shape[{j}]" for j in range(len(v.shape))) if v.id in names \
                else (None,) * len(v.shape)
        return dims[v.id]

    def by_value(d: int) -> str:
        return sizes.get(d, str(d))

    def ref(arg: Arg, counted: tuple[int, str] | None = None) -> str:
        if isinstance(arg, Value):
            return names[arg.id]
        if isinstance(arg, float) and counted is not None:  # a mean's division (or its reciprocal's product)
            n, expr = counted
            if n > 1 and arg == float(n):
                return f"float({expr})"
            if n > 1 and math.isclose(arg, 1.0 / n, rel_tol=1e-6):
                return f"(1.0 / ({expr}))"
        if isinstance(arg, float) and arg > 1 and arg.is_integer() and int(arg) in sizes:
            return f"float({sizes[int(arg)]})"
        return literal(arg)

    def shape(dims_: tuple[int, ...], known: tuple[str | None, ...] = ()) -> str:
        known = known or (None,) * len(dims_)
        return "(" + "".join(f"{k or by_value(int(d))}, " for d, k in zip(dims_, known, strict=True)) + ")"

    def elementwise_axes(op: Op) -> tuple[str | None, ...]:
        """Each output axis named after the first operand of the output's rank that has that size there."""
        operands = [a for a in op.args if isinstance(a, Value) and len(a.shape) == len(op.out.shape)]
        return tuple(next((axes(a)[i] for a in operands if a.shape[i] == d and axes(a)[i]), None)
                     for i, d in enumerate(op.out.shape))

    def dot_axes(op: Op) -> tuple[str | None, ...]:
        """dot_general's output axes: the batch axes, then the lhs's free axes, then the rhs's."""
        lhs, rhs = op.args[:2]
        assert isinstance(lhs, Value) and isinstance(rhs, Value)
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        free_l = [i for i in range(len(lhs.shape)) if i not in tuple(lc) + tuple(lb)]
        free_r = [i for i in range(len(rhs.shape)) if i not in tuple(rc) + tuple(rb)]
        return tuple([axes(lhs)[b] for b in lb] + [axes(lhs)[i] for i in free_l] + [axes(rhs)[i] for i in free_r])

    def broadcast_axes(op: Op) -> tuple[str | None, ...]:
        x, bdims = op.args[0], tuple(op.params["broadcast_dimensions"])
        assert isinstance(x, Value)
        return tuple(axes(x)[bdims.index(i)] if i in bdims and x.shape[bdims.index(i)] == d else None
                     for i, d in enumerate(op.params["shape"]))

    for op in tail:
        x = ref(op.args[0]) if op.args else ""
        p = op.params
        first = op.args[0] if op.args and isinstance(op.args[0], Value) else None
        counted = counts.get(first.id) if first is not None else None
        out_axes: tuple[str | None, ...] = (None,) * len(op.out.shape)
        if op.prim == "broadcast_in_dim":
            out_axes = broadcast_axes(op)
            expr = f"lax.broadcast_in_dim({x}, {shape(p['shape'], out_axes)}, {tuple(p['broadcast_dimensions'])})"
        elif op.prim == "reshape":
            expr = f"jnp.reshape({x}, {shape(p['new_sizes'])})"
        elif op.prim == "squeeze":
            expr = f"lax.squeeze({x}, {tuple(p['dimensions'])})"
        elif op.prim == "expand_dims":
            expr = f"lax.expand_dims({x}, {tuple(p['dimensions'])})"
        elif op.prim == "transpose":
            assert first is not None
            out_axes = tuple(axes(first)[k] for k in p["permutation"])
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
            expr = BINARY[op.prim].format(x, ref(op.args[1], counted))
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
            assert first is not None
            reduced = tuple(int(a) for a in p["axes"])
            out_axes = tuple(k for a, k in enumerate(axes(first)) if a not in reduced)
            counts[op.out.id] = (math.prod(first.shape[a] for a in reduced),
                                 " * ".join(axes(first)[a] or str(first.shape[a]) for a in reduced) or "1")
            expr = f"{REDUCE[op.prim]}({x}, axis={tuple(p['axes'])})"
        else:
            raise unsupported(op.prim, "the reference's last steps")
        if op.prim in UNARY or op.prim in BINARY or op.prim in ("convert_element_type", "integer_pow", "select_n",
                                                                   "clamp"):
            out_axes = elementwise_axes(op)
        elif op.prim == "dot_general":
            out_axes = dot_axes(op)
        out_axes = tuple(k or sizes.get(int(d)) for k, d in zip(out_axes, op.out.shape, strict=True))
        if op.prim in ("broadcast_in_dim", "convert_element_type", "reshape", "squeeze", "expand_dims") \
                and counted is not None:
            counts[op.out.id] = counted  # the same count, laid out anew
        dims[op.out.id] = out_axes
        name = f"t{op.out.id}"
        lines.append(f"{name} = {expr}")
        names[op.out.id] = name
    return lines, names[tail[-1].out.id]
