"""Scans: prefix sums and the first-order linear recurrence, as kernels of their own family.

- Prefix sum: the `cumsum` primitive (jnp.cumsum, lax.cumsum, either direction, any axis) with elementwise work
  before and after it on arrays of its shape (`cumsum(x * x)`, the exclusive `cumsum(x) - x`, ...), or
  `lax.associative_scan(jnp.add, x)`.
- Linear recurrence h_t = a_t * h_{t-1} + x_t (h_{-1} = 0), as `lax.associative_scan` writes it with the combine
  (a1, x1), (a2, x2) -> (a1 a2, a2 x1 + x2). The flat program holds that as strided slices, pads and
  concatenations along one axis; it is confirmed by running those ops in numpy (along the scan axis only) beside
  the recurrence itself, in both directions and with either input as `a`, so anything merely shaped like it is
  refused. A `lax.scan` loop is refused with the reason: the program reader inlines its body as one step, which
  loses its length and direction.

Kernels read each input once and write the output once (a scan is memory-bound):
- prefix sum: a grid over (blocks across the scan, chunks along it), chunks last and 'arbitrary'. Within a chunk
  of C elements the prefix sum is one matmul with a C x C triangle of ones on the MXU; the f32 data is split into
  bf16 parts whose sum is the f32 value, each part times the exact 0/1 triangle accumulating in f32, so the result
  is f32-accurate. A running total in VMEM scratch carries each line's sum from chunk to chunk.
- recurrence: the same grid; within a chunk (time steps on sublanes, features on lanes) a loop over the steps
  updates h for a block of features, and h is carried across chunks in VMEM scratch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.offline.expr import FLOAT_DTYPES, FULL, SCALAR, BlockCode, NotRecognised, kind_of, source_helpers
from agents.offline.kernel_family import floor_in
from agents.offline.program import Op, Program, Value, itemsize
from tpu_runner.hardware.targets import ChipSpec

MiB = 2**20
BLOCK_TARGET_BYTES = 2 * MiB  # a streamed block long enough to reach HBM bandwidth, small enough to double-buffer
DEFAULT_VMEM_LIMIT = 64 * MiB

# Cumulative primitives other than cumsum, in the words of a refusal.
_OTHER_CUMULATIVE = {"cumprod": "a cumulative product", "cummax": "a running maximum",
                     "cummin": "a running minimum", "cumlogsumexp": "a cumulative log-sum-exp"}
# What lax.associative_scan leaves in the flat program (plus the combine's own elementwise ops).
_ASSOCIATIVE = {"slice", "pad", "concatenate", "rev", "add", "mul", "convert_element_type"}
_ELEMENTWISE = {"add", "sub", "mul", "div", "max", "min", "pow", "select_n", "atan2", "rem"}
SCANS_WRITTEN = ("prefix sums (cumsum, either direction, any axis, with elementwise work around it) and the linear "
                 "recurrence h_t = a_t * h_{t-1} + x_t written with lax.associative_scan")


def _roofline(moved: int, chip: ChipSpec, what: str) -> str:
    seconds = moved / chip.hbm_bandwidth
    return (f"{what} is memory-bound: {moved / MiB:.0f} MiB must cross HBM (each input read once, the output written "
            f"once), at least {seconds * 1e3:.3g} ms at {chip.name}'s {chip.hbm_bandwidth / 1e9:.0f} GB/s; the "
            "kernel reads each input block once and writes each output block once.")


def _vmem_space() -> tuple[int, ...]:
    return tuple(m * MiB for m in (16, 32, 64, 100))


# -- prefix sums ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cumsum:
    shape: tuple[int, ...]  # the scanned array's shape
    axis: int
    reverse: bool
    operands: tuple[tuple[int, Value, str], ...]  # (input position, value, FULL or SCALAR)
    pre: tuple[Op, ...]  # elementwise work computing the scanned value
    scan_in: Value
    scan_out: Value
    post: tuple[Op, ...]  # elementwise work on the prefix sums
    output: Value
    n_inputs: int
    n_static: int

    family = "scan"
    reduces = True  # the scan axis is carried from grid step to grid step, like a reduction

    @property
    def lanes(self) -> bool:
        """The scan runs along the last axis: along lanes, the data as (rows, n)."""
        return self.axis == len(self.shape) - 1

    def describe(self) -> str:
        way = "reverse " if self.reverse else ""
        around = len(self.pre) + len(self.post)
        extra = f" with {around} elementwise ops around it" if around else ""
        return (f"{way}prefix sum along axis {self.axis} of {self.scan_in.dtype}{list(self.shape)}{extra} "
                f"(output {self.output.dtype})")

    def space(self) -> dict[str, tuple[Any, ...]]:
        across = ("BLOCK_ROWS", (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)) if self.lanes \
            else ("BLOCK_COLS", (128, 256, 512, 1024, 2048, 4096))
        chunks = (128, 256, 512) if self.lanes else (64, 128, 256, 512)
        # SPLITS: bf16 parts per f32 value; 2 leave ~2^-17 of each element, 3 are exact to f32 rounding.
        return {across[0]: across[1], "CHUNK": chunks, "SPLITS": (2, 3), "VMEM_LIMIT_BYTES": _vmem_space()}

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        space = self.space()
        n = self.shape[self.axis]
        size = math.prod(self.shape)
        moved = sum(v.size * itemsize(v.dtype) for _, v, _ in self.operands) + self.output.size \
            * itemsize(self.output.dtype)
        reasons = [_roofline(moved, chip, f"A prefix sum of {size / 2**20:.0f}M elements with "
                             f"{len(self.pre) + len(self.post)} elementwise ops around it")]
        # v5e's MXU is 128 wide, v6e's 256: a chunk of one MXU width is one pass of the systolic array.
        chunk = floor_in(space["CHUNK"], 128 if chip.name == "v5e" else 256)
        splits = 2
        mxu = 2 * splits * size * min(chunk, n)
        reasons.append(
            f"Within a chunk of {chunk} elements the prefix sum is one matmul with a {chunk}x{chunk} triangle of ones "
            f"on the MXU. The f32 data goes as {splits} bf16 parts (the high bits, then the rounding rest), each times "
            "the exact 0/1 triangle with f32 accumulation, so each element keeps ~2^-17 of its size and 8192-long "
            f"sums stay within a 1e-3 tolerance: {mxu / 1e9:.1f} GFLOP, {mxu / chip.peak_for('bfloat16') * 1e3:.3g} ms "
            "at the bf16 peak, under the memory time. The triangle's block index never changes, so it is fetched once.")
        full = 1 + sum(kind == FULL for _, _, kind in self.operands)
        across_key = "BLOCK_ROWS" if self.lanes else "BLOCK_COLS"
        # Each streamed block ~2 MiB: rows (or lanes) x chunk x 4 bytes.
        across = floor_in(space[across_key], max(8, BLOCK_TARGET_BYTES // (4 * chunk)))
        lines = math.prod(self.shape) // n
        working = (2 * full * across * chunk * 4 + 4 * across * chunk * 4 + across * 128 * 4) / MiB
        reasons.append(
            f"Blocks of {across} {'rows' if self.lanes else 'lanes'} x {chunk}: "
            f"~{across * chunk * 4 / MiB:.1f} MiB per streamed block, {full} streams double-buffered plus the bf16 "
            f"parts and the f32 sums, ~{working:.0f} MiB "
            f"in a {DEFAULT_VMEM_LIMIT // MiB} MiB scoped VMEM limit ({chip.vmem_bytes // MiB} MiB on "
            f"{chip.name}); {lines} lines of {n}.")
        reasons.append(
            "A running total per line in VMEM scratch carries the sum from chunk to chunk: the chunk axis is the "
            "grid's last and 'arbitrary'" + (", walked from the end for a reverse scan." if self.reverse else "."))
        if n % chunk and n > chunk:
            reasons.append(f"{n} is not a multiple of the chunk: the scan axis is padded and the padding masked to 0.")
        return {across_key: across, "CHUNK": chunk, "SPLITS": splits, "VMEM_LIMIT_BYTES": DEFAULT_VMEM_LIMIT}, reasons

    def strategy(self) -> str:
        return ("One pallas_call over (blocks of lines, chunks along the scan), the chunk axis last and 'arbitrary'. "
                "Per chunk: the elementwise work before the scan on the block in VMEM, the chunk's prefix sums as a "
                "matmul with a triangle of ones on the MXU (f32 split into exact bf16 parts), plus the running total "
                "from the previous chunks (VMEM scratch), then the elementwise work after it and one store.")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        return _cumsum_source(self, params, header, tunable_text)


def _cumsum_code(spec: Cumsum, names: dict[int, str]) -> tuple[list[str], list[str], str, str]:
    """The kernel's lines before the scan, the scanned expression, the lines after it and the result."""
    code = BlockCode(main=spec.shape, names={}, kinds={}, lines=[])
    for i, value, kind in spec.operands:
        cast = ".astype(jnp.float32)" if value.dtype in FLOAT_DTYPES else ""
        code.bind(value, f"{names[i]}[...]{cast}", kind)
    for op in spec.pre:
        code.emit(op)
    pre, scanned = list(code.lines), code.ref(spec.scan_in)
    code.lines = []
    code.names[spec.scan_out.id], code.kinds[spec.scan_out.id] = "y", FULL
    for op in spec.post:
        code.emit(op)
    return pre, [scanned], code.lines, code.ref(spec.output)




def _cumsum_source(spec: Cumsum, params: dict[str, Any], header: str, tunable_text: str) -> str:
    refs = {i: f"x{i}_ref" for i, _, _ in spec.operands}
    pre, (scanned,), post, result = _cumsum_code(spec, refs)
    body = "\n".join(f"    {line}" for line in pre)
    after = "\n".join(f"    {line}" for line in post)
    full = [i for i, _, kind in spec.operands if kind == FULL]
    lanes = spec.lanes
    ax = 1 if lanes else 0  # the scan's axis inside a block
    if lanes:
        # [c, c]: t[i, j] = 1 where element i counts towards position j; (s @ t)[:, j] is the prefix sum at j.
        keep = "i >= j" if spec.reverse else "i <= j"
        product = "jnp.dot(part, t, preferred_element_type=jnp.float32)"
        carry_of = "y[:, :1]" if spec.reverse else "y[:, -1:]"
        grid = "(lines_p // bl, nc)"
        chunk_index = "nc - 1 - j" if spec.reverse else "j"
        full_spec = f"pl.BlockSpec((bl, c), lambda i, j: (i, {chunk_index}))"
        scalar_spec = "pl.BlockSpec((1, 1), lambda i, j: (0, 0))"
        tri_spec = "pl.BlockSpec((c, c), lambda i, j: (0, 0))"
        carry_shape = "(bl, 1)"
        semantics = '("parallel", "arbitrary")'
        shaped_full = "_padded(_padded(a{i}.reshape(lines, n), 0, lines_p), 1, n_p)"
        shaped_scalar = "jnp.reshape(a{i}, (1, 1))"
        out_spec = full_spec
        out_shape = "(lines_p, n_p)"
        crop = "out[:lines, :n]"
        setup = ("    n = shape[-1]\n    lines = math.prod(shape[:-1])\n"
                 "    bl = _block(lines, BLOCK_ROWS, 8)\n    lines_p = _round_up(lines, bl)\n")
        chunk_id = "pl.program_id(1)"
        across_note = "rows"
    else:
        # [c, c]: t[i, j] = 1 where element j counts towards position i; (t @ s)[i] is the prefix sum at i.
        keep = "j >= i" if spec.reverse else "j <= i"
        product = "jnp.dot(t, part, preferred_element_type=jnp.float32)"
        carry_of = "y[:1, :]" if spec.reverse else "y[-1:, :]"
        grid = "(pre, post_p // bl, nc)"
        chunk_index = "nc - 1 - j" if spec.reverse else "j"
        full_spec = f"pl.BlockSpec((None, c, bl), lambda p, q, j: (p, {chunk_index}, q))"
        scalar_spec = "pl.BlockSpec((None, 1, 1), lambda p, q, j: (0, 0, 0))"
        tri_spec = "pl.BlockSpec((c, c), lambda p, q, j: (0, 0))"
        carry_shape = "(1, bl)"
        semantics = '("parallel", "parallel", "arbitrary")'
        shaped_full = "_padded(_padded(a{i}.reshape(pre, n, post), 1, n_p), 2, post_p)"
        shaped_scalar = "jnp.reshape(a{i}, (1, 1, 1))"
        out_spec = full_spec
        out_shape = "(pre, n_p, post_p)"
        crop = "out[:, :n, :post]"
        setup = (f"    n = shape[{spec.axis}]\n    pre = math.prod(shape[:{spec.axis}])\n"
                 f"    post = math.prod(shape[{spec.axis + 1}:])\n"
                 "    bl = _block(post, BLOCK_COLS, 128)\n    post_p = _round_up(post, bl)\n")
        chunk_id = "pl.program_id(2)"
        across_note = "lanes"
    chunk_align = 128 if lanes else 8
    prepared = "\n".join(
        f"    x{i} = {(shaped_full if kind == FULL else shaped_scalar).format(i=i)}" for i, _, kind in spec.operands)
    in_specs = ", ".join([tri_spec] + [full_spec if kind == FULL else scalar_spec for _, _, kind in spec.operands])
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    ref_names = ", ".join(refs[i] for i, _, _ in spec.operands)
    operands = ", ".join(f"x{i}" for i, _, _ in spec.operands)
    main = full[0] if full else spec.operands[0][0]
    reverse = "True" if spec.reverse else "False"
    shape_of = f"a{main}.shape" if full else f"{spec.shape!r}"
    ops = max(1, len(spec.pre) + len(spec.post))
    out_bytes = itemsize(spec.output.dtype)
    return header.replace("import jax\n", "import functools\nimport math\n\nimport jax\n", 1) + tunable_text + f'''
REVERSE = {reverse}
{source_helpers()}

def _triangle(c):
    """The 0/1 matrix whose product with a chunk is the chunk's prefix sums (exact in bf16)."""
    i = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    j = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    return jnp.where({keep}, 1.0, 0.0).astype(jnp.bfloat16)


def _prefix(s, t):
    """The chunk's prefix sums on the MXU, f32-accurate: s is split into SPLITS bf16 parts (each the rounding
    rest of the ones before it, exact in f32), and each part times the 0/1 triangle accumulates in f32."""
    y = None
    rest = s
    for _ in range(SPLITS):
        part = rest.astype(jnp.bfloat16)
        rest = rest - part.astype(jnp.float32)
        d = {product}
        y = d if y is None else y + d
    return y


def _kernel(t_ref, {ref_names}, o_ref, carry_ref, *, n, c, nc):
    # Blocks: {across_note} x chunk (the scan's axis is {ax} of a block); carry_ref: the running total per line.
    j = {chunk_id}

    @pl.when(j == 0)
    def _init():
        carry_ref[...] = jnp.zeros_like(carry_ref)

{body}
    s = jnp.broadcast_to({scanned}, o_ref.shape).astype(jnp.float32)
    if n % c:
        # Padding past the end of the scan must add nothing, whatever the work before the scan made of it.
        position = ({chunk_index}) * c + lax.broadcasted_iota(jnp.int32, s.shape, {ax})
        s = jnp.where(position < n, s, 0.0)
    y = _prefix(s, t_ref[...]) + carry_ref[...]
    carry_ref[...] = {carry_of}
{after}
    o_ref[...] = jnp.broadcast_to({result}, o_ref.shape).astype(o_ref.dtype)


def computation({args}):
    shape = {shape_of}
{setup}    c = n if n <= CHUNK else _block(n, CHUNK, {chunk_align})
    n_p = _round_up(n, c)
    nc = n_p // c
{prepared}
    out = pl.pallas_call(
        functools.partial(_kernel, n=n, c=c, nc=nc),
        grid={grid},
        in_specs=[{in_specs}],
        out_specs={out_spec},
        out_shape=jax.ShapeDtypeStruct({out_shape}, jnp.{spec.output.dtype}),
        scratch_shapes=[pltpu.VMEM({carry_shape}, jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics={semantics},
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=(2 * SPLITS * c + {ops}) * math.prod(shape), transcendentals=0,
            bytes_accessed={" + ".join(f"x{i}.size * x{i}.dtype.itemsize" for i in full) or "0"}
            + math.prod(shape) * {out_bytes}),
    )(_triangle(c), {operands})
    return {crop}.reshape(shape)
'''


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
    where = scan_index = program.ops.index(scan)
    pre, post = tuple(program.ops[:where]), tuple(program.ops[scan_index + 1:])
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
    spec = Cumsum(shape=shape, axis=axis, reverse=bool(scan.params.get("reverse", False)), operands=tuple(operands),
                  pre=pre, scan_in=source, scan_out=scan.out, post=post, output=output,
                  n_inputs=len(program.inputs), n_static=len(program.static))
    _check_elementwise(spec)
    return spec


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


# -- the linear recurrence ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recurrence:
    shape: tuple[int, ...]
    axis: int  # the time axis; the features after it lie along lanes
    reverse: bool
    a: int  # input positions
    x: int
    dtype: str
    out_dtype: str
    n_inputs: int
    n_static: int

    family = "scan"
    reduces = True

    def describe(self) -> str:
        way = "reverse " if self.reverse else ""
        return (f"{way}linear recurrence h_t = a_t * h_(t-1) + x_t along axis {self.axis} of "
                f"{self.dtype}{list(self.shape)} (a = input {self.a}, x = input {self.x})")

    def space(self) -> dict[str, tuple[Any, ...]]:
        return {"BLOCK_COLS": (128, 256, 512, 1024, 2048), "CHUNK": (8, 16, 32, 64, 128, 256, 512, 1024),
                "UNROLL": (1, 2, 4, 8), "VMEM_LIMIT_BYTES": _vmem_space()}

    def params(self, chip: ChipSpec) -> tuple[dict[str, Any], list[str]]:
        space = self.space()
        n = self.shape[self.axis]
        post = math.prod(self.shape[self.axis + 1:])
        moved = 2 * math.prod(self.shape) * itemsize(self.dtype) + math.prod(self.shape) * itemsize(self.out_dtype)
        reasons = [_roofline(moved, chip, f"A linear recurrence over {n} steps of {post} features (2 FLOP per "
                             "element)")]
        cols = floor_in(space["BLOCK_COLS"], min(post, 512)) if post >= 128 else 128
        chunk = floor_in(space["CHUNK"], max(8, BLOCK_TARGET_BYTES // 2 // (4 * cols)))
        reasons.append(
            f"Blocks of {chunk} steps x {cols} features (~{chunk * cols * 4 / MiB:.2f} MiB per stream, three streams "
            f"double-buffered in a {DEFAULT_VMEM_LIMIT // MiB} MiB scoped VMEM limit): time on sublanes, features on "
            "lanes, so each step's update is one lane-dense row of multiply-adds and h never leaves vector registers "
            "within a chunk.")
        reasons.append(
            "h is carried from chunk to chunk in VMEM scratch: the chunk axis is the grid's last and 'arbitrary'"
            + (", walked from the end for a reverse recurrence." if self.reverse else ".")
            + " The loop over a chunk's steps is unrolled 8 times so loads, multiply-adds and stores overlap.")
        return {"BLOCK_COLS": cols, "CHUNK": chunk, "UNROLL": 8, "VMEM_LIMIT_BYTES": DEFAULT_VMEM_LIMIT}, reasons

    def strategy(self) -> str:
        return ("One pallas_call over (leading batch, blocks of features, chunks of time steps), the time axis last "
                "and 'arbitrary'. Per chunk, a loop over its steps computes h = a_t * h + x_t for a block of "
                "features in f32 and stores each step's h; h carries into the next chunk through VMEM scratch.")

    def source(self, params: dict[str, Any], header: str, tunable_text: str) -> str:
        args = ", ".join([f"a{i}" for i in range(self.n_inputs)] + [f"s{i}" for i in range(self.n_static)])
        step = "c - 1 - k" if self.reverse else "k"
        chunk_index = "nc - 1 - j" if self.reverse else "j"
        spec = f"pl.BlockSpec((None, c, bl), lambda p, q, j: (p, {chunk_index}, q))"
        return header.replace("import jax\n", "import functools\nimport math\n\nimport jax\n", 1) + tunable_text + \
            f'''REVERSE = {self.reverse!r}
{source_helpers()}

def _kernel(a_ref, x_ref, o_ref, h_ref, *, c, unroll):
    # a_ref, x_ref, o_ref: [c steps, bl features]; h_ref: [1, bl], h after the chunks before this one.
    j = pl.program_id(2)

    @pl.when(j == 0)
    def _init():
        h_ref[...] = jnp.zeros_like(h_ref)

    def step(k, h):
        t = {step}
        h = a_ref[pl.ds(t, 1), :].astype(jnp.float32) * h + x_ref[pl.ds(t, 1), :].astype(jnp.float32)
        o_ref[pl.ds(t, 1), :] = h.astype(o_ref.dtype)
        return h

    h_ref[...] = lax.fori_loop(0, c, step, h_ref[...], unroll=unroll)


def computation({args}):
    a, x = a{self.a}, a{self.x}
    shape = x.shape
    n = shape[{self.axis}]
    pre = math.prod(shape[:{self.axis}])
    post = math.prod(shape[{self.axis + 1}:])
    bl = _block(post, BLOCK_COLS, 128)
    post_p = _round_up(post, bl)
    c = n if n <= CHUNK else _block(n, CHUNK, 8)
    n_p = _round_up(n, c)
    nc = n_p // c
    # Zero padding is harmless either way: past the end of a forward scan it is cropped, and a reverse scan
    # meets it first, where a = x = 0 keeps h at its initial 0.
    a3 = _padded(_padded(a.reshape(pre, n, post), 1, n_p), 2, post_p)
    x3 = _padded(_padded(x.reshape(pre, n, post), 1, n_p), 2, post_p)
    out = pl.pallas_call(
        functools.partial(_kernel, c=c, unroll=min(UNROLL, c)),
        grid=(pre, post_p // bl, nc),
        in_specs=[{spec}, {spec}],
        out_specs={spec},
        out_shape=jax.ShapeDtypeStruct((pre, n_p, post_p), jnp.{self.out_dtype}),
        scratch_shapes=[pltpu.VMEM((1, bl), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=2 * math.prod(shape), transcendentals=0,
            bytes_accessed=a3.size * a3.dtype.itemsize + x3.size * x3.dtype.itemsize
            + math.prod(shape) * {itemsize(self.out_dtype)}),
    )(a3, x3)
    return out[:, :n, :post].reshape(shape)
'''


# -- confirming lax.associative_scan by running its ops along the scan axis -------------------------------------------
def _scan_axis(program: Program) -> int | None:
    """The axis the strided slices of an associative scan walk, or None when the program has none."""
    for op in program.ops:
        strides = op.params.get("strides") if op.prim == "slice" else None
        if strides and any(s != 1 for s in strides):
            return next(d for d, s in enumerate(strides) if s != 1)
    return None


def _run_along(program: Program, axis: int, values: list[np.ndarray]) -> np.ndarray:
    """Run the program's ops in float64 on arrays that keep only the scan axis (the others are 1), checking that
    every op acts on whole lines along the other axes; raises NotRecognised when one does not."""
    main = program.inputs[0].shape
    env: dict[int, np.ndarray] = {v.id: a for v, a in zip(program.inputs, values, strict=True)}

    def arg(a: Any) -> Any:
        return env[a.id] if isinstance(a, Value) else float(a)

    def whole(op: Op) -> None:
        shape = op.out.shape
        if len(shape) != len(main) or any(d != m for i, (d, m) in enumerate(zip(shape, main, strict=True))
                                          if i != axis):
            raise NotRecognised(f"the reference's {op.prim} gives {list(shape)}, which does not keep the other axes "
                                f"of {list(main)} whole")

    for op in program.ops:
        whole(op)
        p = op.params
        if op.prim == "slice":
            start, limit = p["start_indices"], p["limit_indices"]
            strides = p.get("strides") or (1,) * len(main)
            out = arg(op.args[0])[(slice(None),) * axis + (slice(start[axis], limit[axis], strides[axis]),)]
        elif op.prim == "pad":
            config = p["padding_config"]
            if any(tuple(c) != (0, 0, 0) for d, c in enumerate(config) if d != axis):
                raise NotRecognised("the reference pads across the scan axis")
            out = _pad(arg(op.args[0]), axis, tuple(config[axis]), arg(op.args[1]))
        elif op.prim == "concatenate":
            if int(p["dimension"]) != axis:
                raise NotRecognised("the reference concatenates across the scan axis")
            out = np.concatenate([np.broadcast_to(arg(a), (1,) * len(main)) if not isinstance(a, Value) else arg(a)
                                  for a in op.args], axis=axis)
        elif op.prim == "rev":
            if tuple(p["dimensions"]) != (axis,):
                raise NotRecognised("the reference reverses an axis other than the scan's")
            out = np.flip(arg(op.args[0]), axis=axis)
        elif op.prim in ("add", "mul"):
            left, right = arg(op.args[0]), arg(op.args[1])
            out = left + right if op.prim == "add" else left * right
        elif op.prim == "convert_element_type":
            out = np.asarray(arg(op.args[0]), dtype=np.float64)
        else:
            raise NotRecognised(f"the reference's associative scan uses {op.prim}")
        env[op.out.id] = np.broadcast_to(out, tuple(1 if i != axis else d for i, d in enumerate(op.out.shape)))
    result = program.outputs[0]
    return env[result.id] if isinstance(result, Value) else np.asarray(float(result))


def _pad(x: np.ndarray, axis: int, config: tuple[int, int, int], value: float) -> np.ndarray:
    low, high, interior = config
    moved = np.moveaxis(x, axis, 0)
    n = moved.shape[0]
    spread = np.full(((n - 1) * (interior + 1) + 1 if n else 0,) + moved.shape[1:], value, dtype=np.float64)
    spread[::interior + 1] = moved
    spread = np.concatenate([np.full((low,) + moved.shape[1:], value), spread]) if low >= 0 else spread[-low:]
    spread = np.concatenate([spread, np.full((high,) + moved.shape[1:], value)]) if high >= 0 else spread[:high]
    return np.moveaxis(spread, 0, axis)


def _recurrence_model(a: np.ndarray, x: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    a, x = np.moveaxis(a, axis, 0), np.moveaxis(x, axis, 0)
    h = np.zeros_like(x)
    carry = np.zeros(x.shape[1:])
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    for t in steps:
        carry = a[t] * carry + x[t]
        h[t] = carry
    return np.moveaxis(h, 0, axis)


def _agrees(got: np.ndarray, want: np.ndarray) -> bool:
    return got.shape == want.shape and bool(np.all(np.abs(got - want) <= 1e-9 * (1.0 + np.abs(want))))


def _associative(program: Program, output: Value) -> Cumsum | Recurrence:
    axis = _scan_axis(program)
    assert axis is not None
    used = [v for v in program.inputs if program.users(v)]
    main = used[0].shape if used else ()
    if not used or any(v.shape != main for v in used) or len(used) > 2 or output.shape != main:
        raise NotRecognised("an associative scan whose inputs and output are not one or two arrays of one shape; "
                            f"the offline brain writes {SCANS_WRITTEN}")
    if any(v.dtype not in FLOAT_DTYPES for v in used):
        raise NotRecognised("an associative scan of non-float arrays")
    n = main[axis]
    rng = np.random.default_rng(20261203)
    line = tuple(1 if d != axis else n for d in range(len(main)))
    positions = {v.id: i for i, v in enumerate(program.inputs)}

    def run(arrays: dict[int, np.ndarray]) -> np.ndarray:
        return _run_along(program, axis, [arrays.get(v.id, np.zeros(line)) for v in program.inputs])

    if len(used) == 1:
        x = rng.standard_normal(line)
        got = run({used[0].id: x})
        for reverse in (False, True):
            want = np.flip(np.cumsum(np.flip(x, axis), axis), axis) if reverse else np.cumsum(x, axis)
            if _agrees(got, want):
                return Cumsum(shape=main, axis=axis, reverse=reverse,
                              operands=((positions[used[0].id], used[0], FULL),),
                              pre=(), scan_in=used[0], scan_out=output, post=(), output=output,
                              n_inputs=len(program.inputs), n_static=len(program.static))
    else:
        for a_v, x_v in (used, used[::-1]):
            a, x = rng.uniform(0.5, 1.0, line), rng.standard_normal(line)
            got = run({a_v.id: a, x_v.id: x})
            for reverse in (False, True):
                if _agrees(got, _recurrence_model(a, x, axis, reverse)):
                    return Recurrence(shape=main, axis=axis, reverse=reverse, a=positions[a_v.id],
                                      x=positions[x_v.id], dtype=x_v.dtype, out_dtype=output.dtype,
                                      n_inputs=len(program.inputs), n_static=len(program.static))
    raise NotRecognised(f"the reference scans along axis {axis} with lax.associative_scan, but its numbers are "
                        f"neither a prefix sum nor h_t = a_t * h_(t-1) + x_t; the offline brain writes {SCANS_WRITTEN}")


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
    if prims <= _ASSOCIATIVE and _scan_axis(program) is not None and prims & {"pad", "concatenate"}:
        return _associative(program, output)
    loop = _inlined_loop(program)
    if loop is not None:
        whole = next(a.shape for a in loop.args if isinstance(a, Value) and a.size > loop.out.size)
        raise NotRecognised(f"the reference loops (lax.scan or fori_loop: its {loop.prim} combines a whole "
                            f"{list(whole)} array into "
                            f"one {list(loop.out.shape)} step), and its program keeps neither the loop's length nor "
                            "its direction; the offline brain writes the linear recurrence when it is written with "
                            "lax.associative_scan")
    return None
