"""Is the program checked at small shapes the program timed at production shapes?

A candidate traced at two shapes gives two jaxprs. Written as a *form* - every equation with its primitive, its
structural parameters, the dtypes and ranks of its values, the kernels' grids, BlockSpecs, index maps and
bodies - with sizes abstracted, an honest kernel has the same form at both shapes. A kernel that branches on
the input's size (a cheaper body, another kernel, work skipped in the surrounding XLA code) does not.

Abstracted: array sizes, integer literals and the integer parameters that carry sizes (reshape sizes, slice
bounds, iota shapes, grid extents, block sizes, scan lengths and unroll factors). Kept: everything else, including axes,
dimension numbers and dtypes. Float literals are kept too, except where both are derived from the sizes
(`1/n` of a mean, `1/sqrt(d)` of attention), since those legitimately change with the shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from jax.extend import core as jex_core

# Equation parameters whose integers are sizes, not structure.
SIZE_PARAMS = frozenset({
    "shape", "sizes", "new_sizes", "slice_sizes", "start_indices", "limit_indices", "broadcast_sizes",
    "padding_config", "size", "length", "dimension_size", "num_groups", "split_sizes", "block_shape", "grid",
    "operand_shape", "indices", "window_dimensions", "window_strides", "padding", "base_dilation",
    "window_dilation", "lhs_dilation", "rhs_dilation", "feature_group_count", "batch_group_count", "strides",
    "sharding",
    "unroll",  # a loop's unroll factor (the body is the same; kernels unroll by their trip count, which scales)
})
# Parameters that change nothing the kernel computes, or that the candidate only claims.
IGNORED_PARAMS = frozenset({"cost_estimate", "debug", "debug_info", "metadata", "interpret", "name_and_src_info",
                            "out_avals", "out_sharding", "donated_invars", "inline", "keep_unused", "ctx_mesh",
                            "compiler_params", "mesh", "in_layouts", "out_layouts", "resource_env",
                            "in_shardings", "out_shardings", "compiler_options_kvs"})
_INT = re.compile(r"(?<![\w.])-?\d+(?![\w.])")
_ADDRESS = re.compile(r"0x[0-9a-f]+")
_FLOAT_MARK = "§"  # floats are written as §<value>§ and compared apart


@dataclass(frozen=True)
class ProgramForm:
    lines: tuple[str, ...]
    floats: tuple[float, ...]  # the float literals, in the order their marks appear
    sizes: frozenset[int]  # every size seen in the program (for telling derived floats)


class _Writer:
    def __init__(self, transparent: frozenset[str] = frozenset()) -> None:
        self.transparent = transparent
        self.lines: list[str] = []
        self.floats: list[float] = []
        self.sizes: set[int] = set()

    def aval(self, aval: Any) -> str:
        shape = getattr(aval, "shape", None)
        dtype = getattr(aval, "dtype", None)
        inner = getattr(aval, "inner_aval", None)
        if inner is not None:  # a Ref
            space = getattr(aval, "memory_space", None)
            return f"Ref<{space}>{{{self.aval(inner)}}}"
        if shape is None:
            return type(aval).__name__
        self.sizes.update(int(d) for d in shape if isinstance(d, int))
        return f"{dtype}[{','.join('_' for _ in shape)}]"

    def literal(self, value: Any) -> str:
        try:
            number = float(value)
        except (TypeError, ValueError):
            return "lit"
        if float(number).is_integer() and not isinstance(value, float):
            return "#int"
        self.floats.append(number)
        return f"{_FLOAT_MARK}f{_FLOAT_MARK}"

    def value(self, key: str, value: Any, depth: int) -> str:
        if isinstance(value, jex_core.ClosedJaxpr | jex_core.Jaxpr):
            self.jaxpr(value, depth + 1, f"{key}:")
            return "<jaxpr>"
        if isinstance(value, tuple | list) and value and all(
                isinstance(v, jex_core.ClosedJaxpr | jex_core.Jaxpr) for v in value):
            for i, v in enumerate(value):
                self.jaxpr(v, depth + 1, f"{key}[{i}]:")
            return f"<{len(value)} jaxprs>"
        if callable(value):  # custom_vjp's bwd, thunks: code objects whose repr carries addresses
            return "<function>"
        text = repr(value)
        text = _ADDRESS.sub("0x_", text)
        if key in SIZE_PARAMS or key.endswith("tree"):  # a ref indexer's tree carries its static slice bounds
            self.sizes.update(abs(int(n)) for n in _INT.findall(text))
            text = _INT.sub("_", text)
        return text

    def jaxpr(self, jaxpr: Any, depth: int, title: str) -> None:
        inner = jaxpr.jaxpr if isinstance(jaxpr, jex_core.ClosedJaxpr) else jaxpr
        pad = "  " * depth
        names: dict[Any, str] = {}

        def name(var: Any) -> str:
            if isinstance(var, jex_core.Literal):
                return self.literal(var.val)
            if var not in names:
                names[var] = f"v{len(set(names.values()))}"
            return names[var]

        ins = " ".join(f"{name(v)}:{self.aval(v.aval)}" for v in [*inner.constvars, *inner.invars])
        self.lines.append(f"{pad}{title} lambda {ins}")
        for eqn in inner.eqns:
            if eqn.primitive.name in self.transparent and len(eqn.invars) == 1 and len(eqn.outvars) == 1 \
                    and not isinstance(eqn.invars[0], jex_core.Literal):
                names[eqn.outvars[0]] = name(eqn.invars[0])
                continue
            params = []
            for key in sorted(eqn.params):
                if key in IGNORED_PARAMS:
                    continue
                if key == "grid_mapping":
                    self.grid_mapping(eqn.params[key], depth + 1)
                    params.append("grid_mapping=<below>")
                    continue
                params.append(f"{key}={self.value(key, eqn.params[key], depth)}")
            args = " ".join(name(v) for v in eqn.invars)
            outs = " ".join(f"{name(v)}:{self.aval(v.aval)}" for v in eqn.outvars)
            self.lines.append(f"{pad}  {outs} = {eqn.primitive.name}[{', '.join(params)}] {args}")
        self.lines.append(f"{pad}  in {' '.join(name(v) for v in inner.outvars)}")

    def grid_mapping(self, gm: Any, depth: int) -> None:
        pad = "  " * depth
        grid = tuple(gm.grid)
        self.sizes.update(int(d) for d in grid if isinstance(d, int))
        self.lines.append(f"{pad}grid rank {len(grid)}, inputs {gm.num_inputs}, outputs {gm.num_outputs}, "
                          f"scalar prefetch {gm.num_index_operands}, scratch "
                          f"{[self.aval(a) for a in gm.scratch_avals]}")
        for i, bm in enumerate(gm.block_mappings):
            dims = []
            for d in bm.block_shape:
                kind = type(d).__name__ if d is not None else "None"
                size = getattr(d, "block_size", d)
                if isinstance(size, int):
                    self.sizes.add(size)
                dims.append(kind)
            space = getattr(bm.transformed_block_aval, "memory_space", None)
            self.lines.append(f"{pad}block {i}: {self.aval(bm.array_aval)} blocks ({', '.join(dims)}) in {space}, "
                              f"pipeline {bm.pipeline_mode!r}")
            self.jaxpr(bm.index_map_jaxpr, depth + 1, f"index map {i}:")


def program_form(closed_jaxpr: Any, transparent: frozenset[str] = frozenset()) -> ProgramForm:
    """The form of a traced program; equations of the `transparent` primitives are left out (their result named as
    their operand)."""
    writer = _Writer(transparent)
    writer.jaxpr(closed_jaxpr, 0, "program:")
    return ProgramForm(tuple(writer.lines), tuple(writer.floats), frozenset(writer.sizes))


def _derived(value: float, sizes: Iterable[int]) -> bool:
    """A float that is a size, its reciprocal, its square root or the reciprocal of that."""
    for n in sizes:
        if n <= 0:
            continue
        for candidate in (n, 1.0 / n, math.sqrt(n), 1.0 / math.sqrt(n), n - 1, 1.0 / max(n - 1, 1)):
            if math.isclose(value, candidate, rel_tol=1e-6, abs_tol=0.0):
                return True
    return False


def differences(checked: ProgramForm, timed: ProgramForm, *, limit: int = 3) -> list[str]:
    """What differs between the form checked and the form timed, as lines a person can read (empty: the same)."""
    found: list[str] = []
    if len(checked.lines) != len(timed.lines) or checked.lines != timed.lines:
        for i, (a, b) in enumerate(_aligned(checked.lines, timed.lines)):
            if a != b:
                found.append(f"line {i + 1} of the traced program: checked `{_short(a)}`, timed `{_short(b)}`")
                if len(found) >= limit:
                    break
        return found
    for a, b in zip(checked.floats, timed.floats, strict=True):
        same = a == b or (math.isnan(a) and math.isnan(b))  # a NaN fill value is the same constant
        if not same and not (_derived(a, checked.sizes) and _derived(b, timed.sizes)):
            found.append(f"a constant differs: {a!r} at the checked shapes, {b!r} at the timed shapes")
            if len(found) >= limit:
                break
    return found


def _aligned(a: Sequence[str], b: Sequence[str]) -> list[tuple[str, str]]:
    length = max(len(a), len(b))
    return [(a[i] if i < len(a) else "<nothing>", b[i] if i < len(b) else "<nothing>") for i in range(length)]


def _short(line: str, width: int = 160) -> str:
    line = line.strip()
    return line if len(line) <= width else line[: width - 3] + "..."
