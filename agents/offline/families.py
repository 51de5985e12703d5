"""Recognising a reference's kernel family from its program, by structure.

- rowwise: elementwise and broadcast chains over one main array, with reductions over its last axis allowed
  anywhere (softmax, log-sum-exp, layer/RMS norm, ...); per-column vectors (bias, gamma) and per-row values
  ride along.
- matmul: one matmul (2-D, or batched over a leading axis) whose output feeds any such chain: the epilogue,
  fused into the kernel and computed on the f32 accumulator in VMEM.
- attention: two matmuls, scaled dot-product attention (agents.offline.attention).
- retention: two matmuls without a softmax, a causal decay and an L1 row norm (agents.offline.retention).
- cross-entropy: a row's log-sum-exp minus its label's logit, from logits or a matmul (agents.offline.crossentropy).
- mixture of experts: every expert's MLP on every token, weighted by a top-k routing (agents.offline.moe).
- triangle update: gated projections contracted per channel, RMS-normalised, projected and gated
  (agents.offline.triangle).
- grouped matmul: `ragged_dot` of rows sorted by group (agents.offline.grouped).
- convolution and scan (the agents.offline.conv and agents.offline.scan packages), in their own modules
  (RECOGNISERS).
Everything else gets a NotRecognised that names what it met.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from agents.offline import conv, crossentropy, grouped, moe, retention, scan, triangle
from agents.offline.attention import Attention, recognise_attention
from agents.offline.expr import (
    FLOAT_DTYPES,
    FULL,
    ROW,
    BlockCode,
    NotRecognised,
    has_row_reduction,
    input_kind,
    kind_of,
    unsupported,
)
from agents.offline.kernel_family import FamilySpec
from agents.offline.layout import canonical_convolutions
from agents.offline.moved_axis import rows_last
from agents.offline.program import Op, Program, Value
from agents.offline.tail import TAIL_PRIMS, splits, tail_inputs

# What the offline brain writes, in the words its refusals use (here and in agents.brains).
FAMILIES = ("elementwise/broadcast chains, row reductions and normalisations over the last axis, a matmul or "
            "batched matmul (its weight transposed or not) followed by such a chain (group sums, window pools and a "
            "tail of whole-array work, later matmuls included, left to XLA), scaled dot-product attention (causal "
            "or not, grouped-query heads, a bias, any head layout), retention (two matmuls without a softmax: a "
            "causal decay from positions, rows divided by their absolute sums), cross-entropy losses (from logits "
            "or a language model's head, per row or averaged), mixtures of MLP experts with top-k routing, the "
            "triangle multiplicative update (gated projections contracted per channel, RMS-normalised), grouped "
            "(ragged) matmuls of rows sorted by group, 2-D and "
            "3-D convolutions (padded, strided, input-dilated as a transposed one is) followed by such a chain, a "
            "global pool or a per-plane normalisation, and scans (prefix sums, linear recurrences)")


@dataclass(frozen=True)
class Operand:
    index: int  # position among computation's dynamic arguments
    kind: str  # full | row | col | scalar relative to the main array
    value: Value


@dataclass(frozen=True)
class Rowwise:
    main: tuple[int, ...]
    operands: tuple[Operand, ...]
    ops: tuple[Op, ...]
    output: Value
    out_kind: str
    reduces: bool
    n_inputs: int
    n_static: int
    # The reference's axis the rows run along, when not its last: `main` and the ops are the program with that axis
    # moved last (agents.offline.moved_axis); the kernel reads the reference's layout and transposes in VMEM.
    moved_axis: int | None = None
    # The first of the reference's trailing axes the rows run along, when several: `main` and the ops have them
    # merged into one (the same array in memory).
    merged_from: int | None = None

    family = "rowwise"

    def describe(self) -> str:
        kind = "row reduction / normalisation" if self.reduces else "elementwise chain"
        along = f", along axis {self.moved_axis} of the reference's layout" if self.moved_axis is not None else \
            f", along its axes {self.merged_from}.. merged" if self.merged_from is not None else ""
        return f"{kind} over {self.output.dtype}{list(self.main)}{along} ({len(self.ops)} ops)"


@dataclass(frozen=True)
class Matmul:
    main: tuple[int, ...]  # the matmul's output shape
    lhs: Operand
    rhs: Operand
    rhs_transposed: bool  # rhs is (N, K)
    batched: bool  # (B, M, K) x (B, K, N)
    m: int
    k: int
    n: int
    highest: bool  # the reference asked for Precision.HIGHEST
    dot_out: Value
    operands: tuple[Operand, ...]  # epilogue inputs
    epilogue: tuple[Op, ...]
    output: Value
    out_kind: str
    reduces: bool
    n_inputs: int
    n_static: int
    tail: tuple[Op, ...] = ()  # after `output`, as XLA ops on whole arrays (agents.offline.tail)
    inputs: tuple[Value, ...] = ()  # the reference's inputs, which the tail may read
    lhs_transposed: bool = False  # lhs is (K, M): `a.T @ b`, read as it is stored

    family = "matmul"

    def describe(self) -> str:
        shape = f"{'batched ' if self.batched else ''}{self.m}x{self.k} @ {self.k}x{self.n}"
        epi = f" + {len(self.epilogue)}-op epilogue" + (" with row reductions" if self.reduces else "") \
            if self.epilogue else ""
        later = sum(op.prim == "dot_general" for op in self.tail)
        rest = f", then XLA's {later} later matmul{'s' if later > 1 else ''} and what follows" if later else \
            (f", then {len(self.tail)} XLA ops on whole arrays" if self.tail else "")
        return f"matmul {shape} ({self.lhs.value.dtype}){epi}{rest}"


Spec = Rowwise | Matmul | Attention | FamilySpec

# The families written in their own modules (agents.offline.kernel_family), tried in order before the built-in
# ones: each returns None for a program not of its kind and raises NotRecognised for one it cannot take.
Recogniser = Callable[[Program, Value], FamilySpec | None]
RECOGNISERS: tuple[Recogniser, ...] = (conv.recognise, scan.recognise_scan, retention.recognise_retention,
                                        crossentropy.recognise_cross_entropy, moe.recognise_moe,
                                        triangle.recognise_triangle, grouped.recognise_grouped)


def _single_output(program: Program) -> Value:
    if len(program.outputs) != 1 or not isinstance(program.outputs[0], Value):
        raise NotRecognised("the reference returns several values (or a constant); the offline brain writes "
                            "kernels with one output")
    out = program.outputs[0]
    if out.dtype not in FLOAT_DTYPES:
        raise NotRecognised(f"the reference returns {out.dtype}; the offline brain writes floating-point kernels")
    return out


def _check_ops(ops: list[Op], main: tuple[int, ...], seeded: dict[int, str]) -> None:
    """Dry-run the block emitter so every op is known to be expressible (raises NotRecognised)."""
    code = BlockCode(main=main, names={i: f"x{i}" for i in seeded}, kinds=dict(seeded), lines=[])
    for op in ops:
        code.emit(op)


def _operands(program: Program, main: tuple[int, ...], skip: set[int]) -> tuple[Operand, ...]:
    out = []
    for i, value in enumerate(program.inputs):
        if value.id in skip or not program.users(value):
            continue
        kind = input_kind(value, main, program.users(value))
        if kind is None:
            raise NotRecognised(f"input {i} ({value.dtype}{list(value.shape)}) is neither per element, per row "
                                f"nor per column of the output {list(main)}")
        out.append(Operand(i, kind, value))
    return tuple(out)


def _rowwise(program: Program, output: Value) -> Rowwise:
    biggest = max(program.inputs, key=lambda v: v.size, default=None)
    if biggest is None or len(biggest.shape) == 0:
        raise NotRecognised("the reference has no array input")
    main = biggest.shape
    # Reductions over another axis, or over several trailing ones: the same code on the program with its rows last.
    rows = rows_last(program, main)
    if rows is not None:
        program, main = rows.program, rows.main
        output = next(v for v in program.outputs if isinstance(v, Value) and v.id == output.id)
    operands = _operands(program, main, set())
    if not any(o.kind == FULL for o in operands):
        raise NotRecognised("no input covers the whole output")
    _check_ops(program.ops, main, {o.value.id: o.kind for o in operands})
    out_kind = kind_of(output.shape, main)
    if out_kind not in (FULL, ROW):
        raise NotRecognised(f"the output {list(output.shape)} is neither the size of the input {list(main)} "
                            "nor one value per row")
    return Rowwise(main=main, operands=operands, ops=tuple(program.ops), output=output, out_kind=out_kind,
                   reduces=has_row_reduction(program.ops, main), n_inputs=len(program.inputs),
                   n_static=len(program.static), moved_axis=rows.moved_axis if rows else None,
                   merged_from=rows.merged_from if rows else None)


def _source_input(program: Program, arg: object, *, transposable: bool = False
                  ) -> tuple[Value, tuple[int, ...] | None, Op | None]:
    """The program input a matmul operand comes from, looking through dtype conversions and, for the weight, one
    transpose (`x @ w.T`, as PyTorch's Linear is written); with the transpose's permutation and op."""
    permutation, transpose = None, None
    while isinstance(arg, Value):
        if any(arg.id == v.id for v in program.inputs):
            return arg, permutation, transpose
        producer = program.producer(arg)
        if producer is not None and producer.prim == "transpose" and transposable and transpose is None:
            permutation, transpose = tuple(int(a) for a in producer.params["permutation"]), producer
        elif producer is None or producer.prim != "convert_element_type":
            break
        arg = producer.args[0]
    raise NotRecognised("a matmul operand is computed inside the reference (a prologue); the offline brain fuses "
                        "epilogues after the matmul, not work before it")


def _matmul(program: Program, dot: Op, output: Value) -> Matmul:
    lhs_v, lhs_permutation, lhs_transpose = _source_input(program, dot.args[0], transposable=True)
    rhs_v, permutation, transpose = _source_input(program, dot.args[1], transposable=True)
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    if permutation is not None:  # the dot's axes of the transposed weight, as axes of the weight itself
        rc, rb = tuple(permutation[a] for a in rc), tuple(permutation[a] for a in rb)
    if lhs_permutation is not None:  # likewise for a transposed left operand (`a.T @ b`)
        lc, lb = tuple(lhs_permutation[a] for a in lc), tuple(lhs_permutation[a] for a in lb)
    batched = bool(lb)
    if batched and not (lb == (0,) and rb == (0,) and len(lhs_v.shape) == 3 and len(rhs_v.shape) == 3):
        raise NotRecognised("a batched matmul whose batch axis is not the leading one of 3-D operands")
    rank_l, rank_r = len(lhs_v.shape), len(rhs_v.shape)
    # A 2-D left operand contracted over its first axis is read as stored, (K, M), and multiplied transposed.
    lhs_transposed = not batched and rank_l == 2 and lc == (0,)
    if (lc != (rank_l - 1,) and not lhs_transposed) or (not batched and rank_r != 2):
        raise NotRecognised("a matmul that does not contract the last axis of its left operand with a 2-D weight")
    first, second = (1, 2) if batched else (0, 1)
    if rc == (first,):
        transposed = False
    elif rc == (second,):
        transposed = True
    else:
        raise NotRecognised("a matmul contracting an unexpected axis of its right operand")
    k = lhs_v.shape[0] if lhs_transposed else lhs_v.shape[-1]
    n = rhs_v.shape[second] if not transposed else rhs_v.shape[first]
    m = lhs_v.shape[1] if batched or lhs_transposed else lhs_v.size // k
    main = dot.out.shape
    dot_index = program.ops.index(dot)
    before = [op for op in program.ops[:dot_index] if op is not transpose and op is not lhs_transpose]
    if any(op.prim != "convert_element_type" for op in before):
        raise NotRecognised(f"the reference computes {before[0].prim} before its matmul (a prologue)")
    epilogue = program.ops[dot_index + 1:]
    if lhs_v.dtype not in FLOAT_DTYPES or rhs_v.dtype not in FLOAT_DTYPES:
        raise NotRecognised("an integer matmul")
    inputs_of_dot = {lhs_v.id, rhs_v.id}
    skip = {v.id for v in program.inputs
            if v.id in inputs_of_dot and all(u.prim in ("dot_general", "convert_element_type") or u is transpose
                                             or u is lhs_transpose for u in program.users(v))}
    precision = dot.params.get("precision") or ()
    highest = any("HIGHEST" in str(p) for p in (precision if isinstance(precision, tuple) else (precision,)))
    lhs = Operand(program.inputs.index(lhs_v), "lhs", lhs_v)
    rhs = Operand(program.inputs.index(rhs_v), "rhs", rhs_v)

    def build(ops: list[Op], written: Value, tail: list[Op]) -> Matmul:
        if any(op.prim == "dot_general" for op in ops):  # later matmuls are XLA's, in the tail
            raise NotRecognised("the reference has a second matmul after the first, and no value before it that "
                                "the kernel could write for XLA to finish from")
        operands = _operands(program, main, skip | tail_inputs(program, tail))
        seeded = {o.value.id: o.kind for o in operands} | {dot.out.id: FULL}
        _check_ops(ops, main, seeded)
        out_kind = kind_of(written.shape, main)
        if out_kind not in (FULL, ROW):
            raise NotRecognised(f"the output {list(written.shape)} is neither the matmul's shape nor one value per "
                                "row")
        for op in tail:
            if op.prim not in TAIL_PRIMS:
                raise unsupported(op.prim, "the reference's last steps")
        return Matmul(main=main, lhs=lhs, rhs=rhs, rhs_transposed=transposed, batched=batched, m=m, k=k, n=n,
                      highest=highest, dot_out=dot.out, operands=operands, epilogue=tuple(ops), output=written,
                      out_kind=out_kind, reduces=has_row_reduction(ops, main), n_inputs=len(program.inputs),
                      n_static=len(program.static), tail=tuple(tail), inputs=tuple(program.inputs),
                      lhs_transposed=lhs_transposed)

    try:
        return build(list(epilogue), output, [])
    except NotRecognised as whole:
        # The kernel may still write an earlier value (per element or per row) and XLA ops finish the rest.
        for ops, written, tail in splits(program, list(epilogue), output):
            try:
                return build(ops, written, tail)
            except NotRecognised:
                continue
        raise whole


def recognise(program: Program) -> Spec:
    program = canonical_convolutions(program)
    output = _single_output(program)
    for recogniser in RECOGNISERS:
        spec = recogniser(program, output)
        if spec is not None:
            return spec
    dots = [op for op in program.ops if op.prim == "dot_general"]
    if len(dots) == 2:
        try:
            return recognise_attention(program, dots, output)
        except NotRecognised as not_attention:
            try:  # the first matmul and its epilogue in the kernel, the second one XLA's (a tail)
                return _matmul(program, dots[0], output)
            except NotRecognised:
                raise not_attention from None
    if len(dots) > 2:
        try:
            return _matmul(program, dots[0], output)
        except NotRecognised as why:
            raise NotRecognised(f"the reference has {len(dots)} matmuls ({why}); the offline brain writes "
                                f"{FAMILIES}") from None
    if dots:
        return _matmul(program, dots[0], output)
    return _rowwise(program, output)
