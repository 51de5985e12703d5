"""Recognising a scan by structure: a `cumsum` (with elementwise work before and after it on arrays of its shape),
or the strided slices, pads and concatenations `lax.associative_scan` leaves in the flat program, whose numbers
agents.offline.scan.confirm then checks. Other cumulative primitives and `lax.scan` loops are refused with the
reason: the program reader inlines a loop's body as one step, which loses its length and direction."""

from __future__ import annotations

from agents.offline.expr import FLOAT_DTYPES, FULL, SCALAR, BlockCode, NotRecognised, kind_of
from agents.offline.program import Op, Program, Value
from agents.offline.scan.confirm import confirm_associative
from agents.offline.scan.family import Cumsum, Recurrence
from agents.offline.scan.shape import SCANS_WRITTEN

# Cumulative primitives other than cumsum, in the words of a refusal.
_OTHER_CUMULATIVE = {"cumprod": "a cumulative product", "cummax": "a running maximum",
                     "cummin": "a running minimum", "cumlogsumexp": "a cumulative log-sum-exp"}
# What lax.associative_scan leaves in the flat program (plus the combine's own elementwise ops).
_ASSOCIATIVE = {"slice", "pad", "concatenate", "rev", "add", "mul", "convert_element_type"}
_ELEMENTWISE = {"add", "sub", "mul", "div", "max", "min", "pow", "select_n", "atan2", "rem"}


def _cumsum(program: Program, output: Value) -> Cumsum:
    scans = [op for op in program.ops if op.prim == "cumsum"]
    if len(scans) > 1:
        raise NotRecognised(f"the reference has {len(scans)} prefix sums (cumsum); the offline brain writes one scan "
                            "per kernel")
    scan = scans[0]
    source = scan.args[0]
    if not isinstance(source, Value) or source.dtype not in FLOAT_DTYPES:
        raise NotRecognised("the reference takes a prefix sum (cumsum) of a non-float value; the offline brain "
                            "writes floating-point scans")
    shape = scan.out.shape
    axis = int(scan.params["axis"])
    reverse = bool(scan.params.get("reverse", False))
    skipped: set[int] = set()
    scan_out = scan.out
    flipped = _flips(program, scan, axis)
    if flipped is not None:  # flip(cumsum(flip(x))): the suffix sum, a cumsum the other way
        before, after = flipped
        source, scan_out, reverse = before.args[0], after.out, not reverse
        skipped = {id(before), id(after)}
    where = scan_index = program.ops.index(scan)
    pre = tuple(op for op in program.ops[:where] if id(op) not in skipped)
    post = tuple(op for op in program.ops[scan_index + 1:] if id(op) not in skipped)
    operands: list[tuple[int, Value, str]] = []
    for i, value in enumerate(program.inputs):
        if not program.users(value):
            continue
        kind = kind_of(value.shape, shape)
        if kind not in (FULL, SCALAR):
            raise NotRecognised(f"input {i} ({value.dtype}{list(value.shape)}) is not the scanned array's shape "
                                f"{list(shape)} nor a scalar; the offline brain's scans take elementwise work on "
                                "whole arrays only")
        operands.append((i, value, kind))
    if not any(kind == FULL for _, _, kind in operands):
        raise NotRecognised("no input of the prefix sum's shape")
    spec = Cumsum(shape=shape, axis=axis, reverse=reverse, operands=tuple(operands),
                  pre=pre, scan_in=source, scan_out=scan_out, post=post, output=output,
                  n_inputs=len(program.inputs), n_static=len(program.static))
    _check_elementwise(spec)
    return spec


def _flips(program: Program, scan: Op, axis: int) -> tuple[Op, Op] | None:
    """The flips (`rev` along the scan's axis) right before and right after the prefix sum, each the other's only
    neighbour, or None."""
    def is_flip(op: Op | None) -> bool:
        return op is not None and op.prim == "rev" and tuple(op.params.get("dimensions", ())) == (axis,)

    source = scan.args[0]
    before = program.producer(source) if isinstance(source, Value) else None
    users = program.users(scan.out)
    after = users[0] if len(users) == 1 else None
    if not (is_flip(before) and is_flip(after)) or len(program.users(source)) != 1:
        return None
    assert before is not None and after is not None
    return before, after


def _check_elementwise(spec: Cumsum) -> None:
    """Dry-run the block code: every op must be expressible and act per element (no reductions, no per-row or
    per-column values: a block is a chunk of the scan, not whole rows)."""
    code = BlockCode(main=spec.shape, names={}, kinds={}, lines=[])
    for _, value, kind in spec.operands:
        code.bind(value, "x", kind)
    for op in spec.pre:
        code.emit(op)
    code.names[spec.scan_out.id], code.kinds[spec.scan_out.id] = "y", FULL
    for op in spec.post:
        code.emit(op)
    for op in spec.pre + spec.post:
        if code.kinds.get(op.out.id) not in (FULL, SCALAR):
            raise NotRecognised(f"the reference's {op.prim} around its prefix sum gives {op.out.dtype}"
                                f"{list(op.out.shape)}, not a value per element of {list(spec.shape)}; the offline "
                                "brain's scans take elementwise work only")
    if code.kinds.get(spec.scan_in.id) != FULL:
        raise NotRecognised("the prefix sum's input is not computed per element of its inputs")
    if spec.output.shape != spec.shape:
        raise NotRecognised(f"the output {list(spec.output.shape)} is not the prefix sum's shape {list(spec.shape)}")


def _scan_axis(program: Program) -> int | None:
    """The axis the strided slices of an associative scan walk, or None when the program has none."""
    for op in program.ops:
        strides = op.params.get("strides") if op.prim == "slice" else None
        if strides and any(s != 1 for s in strides):
            return next(d for d, s in enumerate(strides) if s != 1)
    return None


def _inlined_loop(program: Program) -> Op | None:
    """An elementwise op whose operand is a whole array but whose result is one slice of it: how a lax.scan body
    looks once the program reader has inlined it (it keeps no length and no direction)."""
    for op in program.ops:
        if op.prim in _ELEMENTWISE and any(isinstance(a, Value) and a.size > op.out.size for a in op.args):
            return op
    return None


def recognise_scan(program: Program, output: Value) -> Cumsum | Recurrence | None:
    """A scan of the kinds above; None for a program with no scan; NotRecognised for a scan this cannot write."""
    prims = {op.prim for op in program.ops}
    others = sorted(prims & set(_OTHER_CUMULATIVE))
    if others:
        raise NotRecognised(f"the reference uses {_OTHER_CUMULATIVE[others[0]]} ({others[0]}), a scan the offline "
                            f"brain does not write kernels for; it writes {SCANS_WRITTEN}")
    if "cumsum" in prims:
        return _cumsum(program, output)
    axis = _scan_axis(program)
    if prims <= _ASSOCIATIVE and axis is not None and prims & {"pad", "concatenate"}:
        return confirm_associative(program, output, axis)
    loop = _inlined_loop(program)
    if loop is not None:
        whole = next(a.shape for a in loop.args if isinstance(a, Value) and a.size > loop.out.size)
        raise NotRecognised(f"the reference loops (lax.scan or fori_loop: its {loop.prim} combines a whole "
                            f"{list(whole)} array into "
                            f"one {list(loop.out.shape)} step), and its program keeps neither the loop's length nor "
                            "its direction; the offline brain writes the linear recurrence when it is written with "
                            "lax.associative_scan")
    return None
