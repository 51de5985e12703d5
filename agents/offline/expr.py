"""Reference ops as code on VMEM blocks.

Every value of a recognised program is one of four kinds relative to the kernel's main array (the output tile):
FULL (the main shape: a (rows, cols) block), ROW (one value per row: a (rows, 1) block), COL (one per column:
a (1, cols) block) or SCALAR. In those block forms numpy broadcasting does what the reference's explicit
broadcasts did, so broadcasts and keep-dims reshapes become plain aliases and the code is shape-free: the same
kernel serves every size. A typed BlockCode (`typed=True`) writes each float value through the kernel's `_to`,
so its ELEMENTWISE_DTYPES parameter decides: "reference" computes every op in the reference's own dtype (bf16
stays bf16, as XLA computes it on a VPU with bf16 lanes, at twice the f32 rate), "float32" computes everything in
f32 (v5e's VPU has no bf16). An untyped one computes in f32. The result is cast to the output dtype at the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from agents.offline.helper_text import helper_source
from agents.offline.program import Arg, Op, Value

FULL, ROW, COL, SCALAR = "full", "row", "col", "scalar"
# One value per row and per group of g consecutive columns (a group norm's statistics, a pooling window's sum),
# held compact as (rows, cols / g); it meets per-element values through _seg_expand.
SEG = "seg"


class NotRecognised(Exception):
    """The reference falls outside the families the offline brain writes kernels for; the message says why."""


def kind_of(shape: tuple[int, ...], main: tuple[int, ...]) -> str | None:
    if shape == main:
        return FULL
    if all(d == 1 for d in shape):
        return SCALAR
    if shape in (main[:-1], main[:-1] + (1,)):
        return ROW
    if shape and shape[-1] == main[-1] and all(d == 1 for d in shape[:-1]):
        return COL
    return None


UNARY = {
    "exp": "jnp.exp({0})", "log": "jnp.log({0})", "log1p": "jnp.log1p({0})", "expm1": "jnp.expm1({0})",
    "tanh": "jnp.tanh({0})", "logistic": "(1.0 / (1.0 + jnp.exp(-{0})))", "sqrt": "jnp.sqrt({0})",
    "rsqrt": "lax.rsqrt({0})", "abs": "jnp.abs({0})", "neg": "(-{0})", "sign": "jnp.sign({0})",
    "floor": "jnp.floor({0})", "ceil": "jnp.ceil({0})", "round": "jnp.round({0})", "sin": "jnp.sin({0})",
    "cos": "jnp.cos({0})", "erf": "lax.erf({0})", "erfc": "(1.0 - lax.erf({0}))", "square": "({0} * {0})",
    "not": "jnp.logical_not({0})",
    "is_finite": "jnp.isfinite({0}.astype(jnp.float32))",  # Mosaic tests finiteness on f32 only
    "exp2": "jnp.exp2({0})", "tan": "jnp.tan({0})",
    "stop_gradient": "{0}", "copy": "{0}", "copy_p": "{0}", "reduce_precision": "{0}",
    "optimization_barrier": "{0}",
}
BINARY = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "max": "jnp.maximum({0}, {1})", "min": "jnp.minimum({0}, {1})", "pow": "jnp.power({0}, {1})",
    "rem": "lax.rem({0}, {1})", "atan2": "jnp.arctan2({0}, {1})", "and": "({0} & {1})", "or": "({0} | {1})",
    "xor": "({0} ^ {1})", "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})",
    "le": "({0} <= {1})", "gt": "({0} > {1})", "ge": "({0} >= {1})",
}
REDUCE = {"reduce_sum": "jnp.sum", "reduce_max": "jnp.max", "reduce_min": "jnp.min"}
_ALIASES = ("broadcast_in_dim", "reshape", "squeeze", "expand_dims")
_FAMILY_HINTS = {
    "conv_general_dilated": "a convolution", "cumsum": "a scan", "cumprod": "a scan", "cummax": "a scan",
    "cumlogsumexp": "a scan", "gather": "a gather", "scatter": "a scatter", "scatter-add": "a scatter",
    "dynamic_slice": "a data-dependent slice", "dynamic_update_slice": "a data-dependent update",
    "sort": "a sort", "top_k": "a top-k", "argmax": "an arg-reduction", "argmin": "an arg-reduction",
    "while": "a loop", "scan": "a scan", "cond": "a data-dependent branch", "dot_general": "another matmul",
    "transpose": "a transpose", "iota": "index arithmetic (masks)", "concatenate": "a concatenation",
    "pad": "padding", "slice": "a slice",
}
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
DTYPE_CHOICES = ("reference", "float32")  # the values of a typed kernel's ELEMENTWISE_DTYPES
_HELPERS = "agents.offline.kernel_helpers"


def source_helpers() -> str:
    """The helpers every written kernel module of the row-wise, matmul and scan families defines (`_block`,
    `_padded`, `_round_up`), as source text."""
    return "\n\n" + helper_source(_HELPERS, "_block", "_padded", "_round_up") + "\n"


def segment_helpers() -> str:
    """Sums over groups of consecutive columns and their broadcast back (`_seg_sum`, `_seg_expand`), as source
    text: written only where used."""
    return "\n\n" + helper_source(_HELPERS, "_seg_matrix", "_exact_dot", "_seg_sum", "_seg_expand", "_seg_dot") + "\n"


def to_helper() -> str:
    """`_to`, through which a typed kernel writes each float value (ELEMENTWISE_DTYPES), as source text."""
    return "\n\n" + helper_source(_HELPERS, "_to") + "\n"


def as_typed(expr: str, dtype: str) -> str:
    """A loaded value through the kernel's `_to`: floats follow ELEMENTWISE_DTYPES, other dtypes stay."""
    return f"_to({expr}, jnp.{dtype})" if dtype in FLOAT_DTYPES else expr


def dtype_space(dtypes: set[str]) -> tuple[str, ...]:
    """ELEMENTWISE_DTYPES's choices: both when some value is a narrow float, else f32 is the reference's own."""
    return DTYPE_CHOICES if dtypes & {"bfloat16", "float16"} else ("float32",)


def default_dtypes(chip_name: str, choices: tuple[str, ...]) -> str:
    """The reference's dtypes where the VPU has bf16 lanes (v6e on), f32 on v5e."""
    return "float32" if chip_name == "v5e" or "reference" not in choices else "reference"


def unsupported(prim: str, where: str) -> NotRecognised:
    what = _FAMILY_HINTS.get(prim, f"the primitive {prim}")
    return NotRecognised(f"{where} uses {what} ({prim}), which the offline brain does not write kernels for")


def literal(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "jnp.inf" if value > 0 else "-jnp.inf"
        if math.isnan(value):
            return "jnp.nan"
        return repr(value)
    return repr(value)


@dataclass
class BlockCode:
    """Lines computing block values; names maps value ids to the expression that holds them."""

    main: tuple[int, ...]
    names: dict[int, str]
    kinds: dict[int, str]
    lines: list[str]
    cols: str = ""  # an expression for the row length inside the kernel (rows are whole when they are reduced)
    typed: bool = False  # float values follow the kernel's ELEMENTWISE_DTYPES (see the module's docstring)
    groups: dict[int, int] = field(default_factory=dict)  # a SEG value's group size
    narrow: dict[int, str] = field(default_factory=dict)  # an f32 value widened from bf16: the bf16 expression
    expanded: dict[int, str] = field(default_factory=dict)  # a SEG value broadcast back to its columns
    segments: bool = False  # the lines call segment_helpers()

    def ref(self, arg: Arg) -> str:
        if isinstance(arg, Value):
            return self.names[arg.id]
        return literal(arg)

    def kind(self, arg: Arg) -> str:
        return self.kinds[arg.id] if isinstance(arg, Value) else SCALAR

    def bind(self, value: Value, expr: str, kind: str) -> None:
        name = f"v{value.id}"
        self.lines.append(f"{name} = {expr}")
        self.names[value.id], self.kinds[value.id] = name, kind

    def alias(self, value: Value, source: Arg, kind: str) -> None:
        if isinstance(source, Value):
            self.names[value.id], self.kinds[value.id] = self.names[source.id], kind
        else:
            self.bind(value, literal(source), kind)

    def _row_length(self, prim: str, arg: Arg, text: str) -> str:
        """Means and variances divide by the row's length (or its reciprocal, or N - ddof): keep that length
        symbolic, so the kernel serves any width. A constant that only happens to equal it would make the kernel
        wrong at other widths, which the evaluator's checks on other shapes catch."""
        length = float(self.main[-1])
        if isinstance(arg, float) and arg == length and length > 1:
            return f"float({self.cols})"
        if isinstance(arg, float) and prim == "mul" and length > 1 and math.isclose(arg, 1.0 / length, rel_tol=1e-6):
            return f"(1.0 / {self.cols})"
        return text

    def reduced(self, prim: str, expr: str, axis: str = "axis=-1, keepdims=True") -> str:
        """A row reduction of `expr`; a typed sum adds in f32 and rounds once, as XLA's reductions do."""
        if self.typed and prim == "reduce_sum":
            return f"jnp.sum({expr}.astype(jnp.float32), {axis}).astype({expr}.dtype)"
        return f"{REDUCE[prim]}({expr}, {axis})"

    def _grouped(self, shape: tuple[int, ...]) -> int | None:
        """The group size g when `shape` is the main array viewed as (..., cols / g, g)."""
        rank = len(self.main)
        if len(shape) == rank + 1 and shape[:rank - 1] == self.main[:-1] and shape[-2] * shape[-1] == self.main[-1] \
                and shape[-1] > 1 and shape[-2] > 1:
            return shape[-1]
        return None

    def _kind(self, op: Op) -> str | None:
        """The kind of an op's result: full-rank shapes say it themselves; others keep their source's kind."""
        kinds = {self.kind(a) for a in op.args if isinstance(a, Value)}
        source = op.args[0] if op.args else None
        if op.prim == "reduce_window_sum" or op.prim in REDUCE and isinstance(source, Value) \
                and self._grouped(source.shape) and tuple(op.params.get("axes", ())) == (len(self.main),):
            return SEG
        if SEG in kinds:
            if op.prim in REDUCE:
                return ROW
            return FULL if FULL in kinds or COL in kinds else SEG
        if len(op.out.shape) == len(self.main):
            return kind_of(op.out.shape, self.main)
        if op.prim in REDUCE:
            return ROW
        if not kinds:
            return kind_of(op.out.shape, self.main)
        return FULL if FULL in kinds or kinds == {ROW, COL} else (kinds - {SCALAR} or {SCALAR}).pop()

    def _operand(self, arg: Arg, kind: str) -> str:
        """An operand's expression where the result has `kind`: a SEG value meeting per-element ones is broadcast
        back to its columns (once)."""
        if not (isinstance(arg, Value) and self.kind(arg) == SEG and kind == FULL):
            return self.ref(arg)
        if arg.id not in self.expanded:
            name = f"e{arg.id}"
            self.lines.append(f"{name} = _seg_expand({self.names[arg.id]}, {self.groups[arg.id]})")
            self.expanded[arg.id] = name
        return self.expanded[arg.id]

    def _segment_sum(self, op: Op, source: Value, g: int, where: str) -> None:
        if op.prim not in ("reduce_sum", "reduce_window_sum"):
            raise NotRecognised(f"{where} takes the {op.prim[len('reduce_'):]} of groups of columns; the offline "
                                "brain writes sums over groups (group norms, average pools)")
        if 128 % g:
            raise NotRecognised(f"{where} sums groups of {g} columns; the offline brain writes groups that tile a "
                                "128-lane vector (2, 4, ..., 128 columns)")
        self.segments = True
        expr = self.narrow.get(source.id, self.ref(source))  # a bf16 source sums in one exact pass
        self.bind(op.out, f"_seg_sum({expr}, {g}).astype({self.ref(source)}.dtype)", SEG)
        self.groups[op.out.id] = g

    def emit(self, op: Op) -> None:
        kind = self._kind(op)
        where = f"the reference's {op.prim} on {op.out.dtype}{list(op.out.shape)}"
        if kind is None:
            raise NotRecognised(f"{where} is neither per element, per row nor per column of the output "
                                f"{list(self.main)}; the offline brain writes row-wise kernels")
        if op.prim in _ALIASES:
            source = op.args[0]
            if isinstance(source, Value) and self.kind(source) == FULL and kind != FULL or \
                    kind == SEG and self.kind(source) != SEG:
                raise NotRecognised(f"{where} reshapes the per-element data; the offline brain keeps the layout")
            self.alias(op.out, source, kind)
            if isinstance(source, Value) and source.id in self.groups:
                self.groups[op.out.id] = self.groups[source.id]
        elif op.prim == "convert_element_type":
            new = str(op.params["new_dtype"])
            expr = self.ref(op.args[0])
            if new in FLOAT_DTYPES:
                self.bind(op.out, as_typed(expr, new) if self.typed else expr, kind)
                source = op.args[0]
                if new == "float32" and isinstance(source, Value) and source.dtype == "bfloat16":
                    self.narrow[op.out.id] = expr
            else:
                self.bind(op.out, f"{expr}.astype(jnp.{new})", kind)
        elif op.prim in UNARY:
            self.bind(op.out, UNARY[op.prim].format(self.ref(op.args[0])), kind)
        elif op.prim == "integer_pow":
            self.bind(op.out, f"lax.integer_pow({self.ref(op.args[0])}, {int(op.params['y'])})", kind)
        elif op.prim in BINARY:
            left, right = self._operand(op.args[0], kind), self._operand(op.args[1], kind)
            if self.cols and self.kind(op.args[0]) in (ROW, SCALAR):
                right = self._row_length(op.prim, op.args[1], right)
            if self.cols and self.kind(op.args[1]) in (ROW, SCALAR):
                left = self._row_length(op.prim, op.args[0], left)
            self.bind(op.out, BINARY[op.prim].format(left, right), kind)
        elif op.prim == "select_n":
            if len(op.args) != 3:
                raise unsupported("select_n", "a select with more than two cases")
            pred, false, true = (self._operand(a, kind) for a in op.args)
            self.bind(op.out, f"jnp.where({pred}, {true}, {false})", kind)
        elif op.prim == "clamp":
            low, x, high = (self._operand(a, kind) for a in op.args)
            self.bind(op.out, f"jnp.clip({x}, {low}, {high})", kind)
        elif op.prim == "reduce_window_sum":
            source = op.args[0]
            rank = len(self.main)
            window = tuple(op.params.get("window_dimensions", ()))
            g = window[-1] if window else 0
            plain = all(p == (0, 0) for p in op.params.get("padding", ())) and all(
                d == 1 for key in ("base_dilation", "window_dilation") for d in op.params.get(key, ()))
            if not (isinstance(source, Value) and self.kind(source) == FULL and len(window) == rank
                    and window[:-1] == (1,) * (rank - 1) and tuple(op.params.get("window_strides", ())) == window
                    and plain and g > 1 and self.main[-1] % g == 0):
                raise NotRecognised(f"{where} pools windows other than non-overlapping ones along the last axis; the "
                                    "offline brain writes those only")
            self._segment_sum(op, source, g, where)
        elif op.prim in REDUCE:
            axes = tuple(op.params.get("axes", ()))
            source = op.args[0]
            rank = len(self.main)
            if kind == SEG:
                assert isinstance(source, Value)
                self._segment_sum(op, source, source.shape[-1], where)
                return
            if axes != (rank - 1,) or self.kind(source) not in (FULL, SEG):
                raise NotRecognised(f"{where} reduces over axes {list(axes)} of {list(self.main)}; the offline brain "
                                    "writes kernels that reduce over the last axis (rows) only")
            self.bind(op.out, self.reduced(op.prim, self.ref(source)), ROW)
        else:
            raise unsupported(op.prim, "the reference")
        if kind == SEG and op.out.id not in self.groups:
            self.groups[op.out.id] = next(self.groups[a.id] for a in op.args if isinstance(a, Value)
                                          and a.id in self.groups)


def input_kind(value: Value, main: tuple[int, ...], users: list[Op]) -> str | None:
    """An input's kind; a vector as long as both the rows and the columns is told apart by how it is broadcast."""
    if len(value.shape) == 1 and len(main) >= 2 and value.shape[0] == main[-1] == main[-2]:
        for op in users:
            if op.prim == "broadcast_in_dim":
                dims = tuple(op.params.get("broadcast_dimensions", ()))
                return COL if dims == (len(op.out.shape) - 1,) else ROW
    return kind_of(value.shape, main)


def has_row_reduction(ops: list[Op], main: tuple[int, ...]) -> bool:
    """Does some op reduce over whole rows? (A sum over groups of columns, on a (..., cols / g, g) view, does not.)"""
    return any(op.prim in REDUCE and isinstance(op.args[0], Value) and len(op.args[0].shape) == len(main)
               for op in ops)
