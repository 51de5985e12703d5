"""The top-level operations of a compiled XLA:TPU program, read from its optimised HLO text.

For each instruction of the entry computation (and of the bodies of its loops, with their trip counts): what it
is (a matmul or convolution fusion, a reduction, an elementwise loop, a copy or transpose, a Pallas kernel, ...),
the HBM bytes it reads and writes (buffers in VMEM, marked `S(1)` in their layout, are not HBM traffic), its
FLOPs where they follow from shapes (dots and convolutions), and the compiler's own cycle estimate for it (the
`estimated_cycles` XLA:TPU's tiling cost model records in the instruction's backend config). The time model
(`timing.model`) is built on these, so it never needs the candidate's word about its own cost.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field

_ITEMSIZE = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2,
             "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\(")
_CYCLES = re.compile(r'"estimated_cycles":"(\d+)"')
_CALLS = re.compile(r"\bcalls=%([\w.\-]+)")
_BODY = re.compile(r"\bbody=%([\w.\-]+)")
_KIND = re.compile(r"\bkind=(k\w+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
_OPERAND = re.compile(r"%([\w.\-]+)")
_DOT_DIMS = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=([a-z0-9]+)_([a-z0-9]+)->([a-z0-9]+)")
# What an instruction (or the fused computation it calls) does, in the order a class is decided.
_CLASSES = (("custom-call", "custom_call"), ("reduce-window", "reduction"), ("reduce", "reduction"),
            ("scatter", "gather_scatter"), ("gather", "gather_scatter"), ("sort", "sort"), ("transpose", "copy"),
            ("copy", "copy"))


@dataclass(frozen=True)
class HloOp:
    name: str
    opcode: str  # fusion, convolution, copy, custom-call, while, ...
    op_class: str  # matmul, batched_matmul, convolution, reduction, elementwise, copy, custom_call, async, ...
    kind: str  # the fusion kind (kLoop, kInput, kOutput, kCustom) or ""
    hbm_bytes: int  # operands read and results written that live in HBM
    flops: float  # of its dots and convolutions
    xla_cycles: int  # XLA:TPU's own estimate, 0 when it records none
    repeat: int = 1  # times it runs (a loop body's trip count)
    target: str = ""  # a custom call's target: tpu_custom_call (a Pallas kernel), ...
    vpu_elements: int = 0  # elements its elementwise and reduction work touches


@dataclass
class _Instruction:
    name: str
    shape: str
    opcode: str
    rest: str


@dataclass
class _Computation:
    name: str
    entry: bool
    instructions: list[_Instruction] = field(default_factory=list)


def _split_shape(text: str) -> tuple[str, str]:
    """('(bf16[2]{0}, f32[])' or 'bf16[4,8]{1,0}', the rest) of `shape opcode(...)...`."""
    text = text.strip()
    if text.startswith("("):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return text[: i + 1], text[i + 1:].strip()
    shape, _, rest = text.partition(" ")
    return shape, rest


def _parse(text: str) -> dict[str, _Computation]:
    computations: dict[str, _Computation] = {}
    current: _Computation | None = None
    for line in text.splitlines():
        if current is None:
            found = _COMPUTATION.match(line)
            if found and line.rstrip().endswith("{"):
                current = _Computation(found.group(2), bool(found.group(1)))
                computations[current.name] = current
            continue
        if line.startswith("}"):
            current = None
            continue
        found = _INSTRUCTION.match(_without_metadata(line))
        if not found:
            continue
        shape, rest = _split_shape(found.group(2))
        opcode = rest.split("(", 1)[0].strip()
        current.instructions.append(_Instruction(found.group(1), shape, opcode, rest))
    return computations


def array_bytes(shape: str, hbm_only: bool = True) -> int:
    """Bytes of a shape string (tuples summed); buffers in another memory space (`S(n)`, n > 0) not counted."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(shape):
        if hbm_only and layout and re.search(r"S\(([1-9]\d*)\)", layout):
            continue
        count = math.prod(int(d) for d in dims.split(",") if d) if dims else 1
        total += count * _ITEMSIZE.get(dtype, 4)
    return total


def _elements(shape: str) -> int:
    return sum(math.prod(int(d) for d in dims.split(",") if d) if dims else 1 for _, dims, _ in _ARRAY.findall(shape))


def _dims(shape: str) -> list[int]:
    found = _ARRAY.search(shape)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def _flops(inst: _Instruction, shapes: dict[str, str]) -> float:
    """FLOPs of one dot or convolution, from its result and operand shapes."""
    operands = _OPERAND.findall(inst.rest.split(")", 1)[0])
    out = _elements(inst.shape)
    if inst.opcode == "dot" and operands:
        lhs = _dims(shapes.get(operands[0], ""))
        contracting = _DOT_DIMS.search(inst.rest)
        dims = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
        return 2.0 * out * math.prod(lhs[d] for d in dims if d < len(lhs))
    if inst.opcode == "convolution" and len(operands) > 1:
        kernel = _dims(shapes.get(operands[1], ""))
        labels = _DIM_LABELS.search(inst.rest)
        if not kernel or not labels or "o" not in labels.group(2):
            return 0.0
        out_features = kernel[labels.group(2).index("o")]
        batched = math.prod(size for size, is_batch in _window(inst) if is_batch)
        # Each output: input features x window MACs; a batch dimension written as a window is not a MAC.
        return 2.0 * out * math.prod(kernel) / max(out_features, 1) / batched
    return 0.0


def _window(inst: _Instruction) -> list[tuple[int, bool]]:
    """(size, is a batch dimension) per window dimension of a convolution. XLA:TPU writes a batched dot as a
    convolution whose batch dimensions are window dimensions: base-dilated by their size (`size=8 lhs_dilate=8`),
    or of size 2 padded and reversed. They do no spatial work."""
    found = _WINDOW.search(inst.rest)
    if not found:
        return []
    fields = dict(part.split("=", 1) for part in found.group(1).split() if "=" in part)
    sizes = [int(x) for x in fields.get("size", "").split("x") if x]
    dilate = [int(x) for x in fields.get("lhs_dilate", "").split("x") if x] or [1] * len(sizes)
    reversal = [int(x) for x in fields.get("rhs_reversal", "").split("x") if x] or [0] * len(sizes)
    pads = fields.get("pad", "").split("x") if "pad" in fields else ["0_0"] * len(sizes)
    return [(size, size > 1 and (dilate[i] == size or (reversal[i] == 1 and size == 2 and pads[i] == "1_1")))
            for i, size in enumerate(sizes)]


def _contraction_kind(inst: _Instruction) -> str:
    """matmul, batched_matmul or convolution. XLA:TPU writes dots as convolutions; one without a spatial window
    is a matmul, batched when batch dimensions ride in its window (or, for a dot, its batch dimensions)."""
    if inst.opcode == "dot":
        return "batched_matmul" if re.search(r"lhs_batch_dims=\{\d", inst.rest) else "matmul"
    window = _window(inst)
    if any(size > 1 and not is_batch for size, is_batch in window):
        return "convolution"
    return "batched_matmul" if any(is_batch for _, is_batch in window) else "matmul"


def _classify(instructions: list[_Instruction]) -> str:
    kinds = {_contraction_kind(i) for i in instructions if i.opcode in ("dot", "convolution")}
    for kind in ("convolution", "batched_matmul", "matmul"):
        if kind in kinds:
            return kind
    opcodes = [i.opcode for i in instructions]
    for needle, name in _CLASSES:
        if needle in opcodes:
            return name
    return "elementwise" if opcodes else "other"


_NO_TRAFFIC = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "copy-done", "after-all",
               "partition-id", "replica-id", "iota"}


@functools.lru_cache(maxsize=64)
def parsed_hlo(text: str) -> tuple[HloOp, ...]:
    return tuple(hlo_ops(text))


def _without_metadata(line: str) -> str:
    """The instruction without its `metadata={...}`: op names there are the program author's strings."""
    start = line.find("metadata={")
    if start < 0:
        return line
    depth, quoted, escaped = 0, False, False
    for i in range(start + len("metadata="), len(line)):
        ch = line[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif not quoted and ch == "{":
            depth += 1
        elif not quoted and ch == "}":
            depth -= 1
            if depth == 0:
                return line[:start] + line[i + 1:]
    return line[:start]


def hlo_ops(text: str) -> list[HloOp]:
    """The operations of the entry computation (loop bodies inlined with their trip counts)."""
    computations = _parse(text)
    entry = next((c for c in computations.values() if c.entry), None)
    if entry is None:
        return []
    ops: list[HloOp] = []
    _walk(entry, computations, 1, ops)
    return ops


def _walk(comp: _Computation, computations: dict[str, _Computation], repeat: int, ops: list[HloOp]) -> None:
    shapes = {inst.name: inst.shape for inst in comp.instructions}
    for inst in comp.instructions:
        if inst.opcode in _NO_TRAFFIC:
            continue
        if inst.opcode == "while":
            body = _BODY.search(inst.rest)
            trips = _TRIP.search(inst.rest)
            if body and body.group(1) in computations:
                _walk(computations[body.group(1)], computations, repeat * (int(trips.group(1)) if trips else 1),
                      ops)
            continue
        called = _CALLS.search(inst.rest)
        inner = computations.get(called.group(1)) if called else None
        inner_shapes = {i.name: i.shape for i in inner.instructions} if inner else {}
        flops = sum(_flops(i, inner_shapes) for i in inner.instructions) if inner else _flops(inst, shapes)
        operands = _OPERAND.findall(inst.rest.split(")", 1)[0]) if "(" in inst.rest else []
        read = sum(array_bytes(shapes.get(o, "")) for o in operands)
        written = array_bytes(inst.shape)
        if inst.opcode == "copy-start":  # an async prefetch: the bytes move once, counted at the source
            written = 0
        target = _TARGET.search(inst.rest)
        cycles = _CYCLES.search(inst.rest)
        vpu = sum(_elements(i.shape) for i in (inner.instructions if inner else [inst])
                  if i.opcode not in _NO_TRAFFIC and i.opcode not in ("dot", "convolution"))
        if inst.opcode == "copy-start":
            vpu = 0
        # An async copy's start runs beside the ops after it (its bytes still cross HBM, counted at its done).
        op_class = "async" if inst.opcode == "copy-start" else _classify(inner.instructions if inner else [inst])
        ops.append(HloOp(name=inst.name, opcode=inst.opcode, op_class=op_class,
                         kind=(_KIND.search(inst.rest).group(1) if _KIND.search(inst.rest) else ""),
                         hbm_bytes=read + written, flops=flops, xla_cycles=int(cycles.group(1)) if cycles else 0,
                         repeat=repeat, target=target.group(1) if target else "", vpu_elements=vpu))
