"""The convolution kernel's source: an implicit GEMM on the flattened (C_in, positions) layout, the epilogue fused
on the f32 accumulator, the reference's padding, kernel layout steps and strides done by XLA before the kernel and
its tail after. The kernel's fixed helpers are real functions in agents.offline.conv.helpers, pasted as their
source."""

from __future__ import annotations

import math

from agents.offline.conv.epilogue import REDUCTIONS, ConvCode, depends_on_reduction
from agents.offline.conv.params import ConvParams
from agents.offline.conv.shape import (
    FULL,
    PLANE,
    POOL,
    ROW,
    SCALAR,
    TILED,
    ConvShape,
    flattens_in_vmem,
    phase_count,
    row_unit,
    value_kind,
    writes_planes,
)
from agents.offline.expr import as_typed, to_helper
from agents.offline.helper_text import helper_source
from agents.offline.program import Op, itemsize
from agents.offline.tail import wrapper_tail

_HELPERS = "agents.offline.conv.helpers"
_TRANSCENDENTAL = {"exp", "log", "log1p", "expm1", "tanh", "logistic", "sqrt", "rsqrt", "erf", "sin", "cos",
                   "pow"}


def _helpers() -> str:
    """The helpers every convolution kernel defines before `_conv_chunk`, as source text."""
    return helper_source("agents.offline.kernel_helpers", "_round_up") + "\n\n\n" \
        + helper_source(_HELPERS, "_padded", "_valid_mask")


def _layout_helpers(spec: ConvShape) -> str:
    """The helpers a strided or transposed convolution's wrapper calls, as source text (empty for neither)."""
    if spec.strides:
        return "\n\n" + helper_source(_HELPERS, "_space_to_depth") + "\n"
    if spec.phases:
        return "\n\n" + helper_source(_HELPERS, "_phase_taps", "_stride_phases", "_interleave_phases") + "\n"
    return ""


def _fresh_code(spec: ConvShape, conv: str, rows: str = "...") -> ConvCode:
    """Block code with the convolution's value bound to `conv` and the operands to their refs' `rows`."""
    code = ConvCode(main=(spec.c_out, math.prod(spec.out_spatial)), names={}, kinds={}, lines=[],
                    cols="count", typed=True, conv_main=spec.conv_out.shape)
    code.bind(spec.conv_out, as_typed(conv, spec.conv_out.dtype), FULL)
    for o in spec.operands:
        where = rows if o.kind == ROW else "..."
        code.bind(o.value, as_typed(f"e{o.index}_ref[{where}]", o.value.dtype), o.kind)
    return code


def _epilogue(spec: ConvShape, ops: tuple[Op, ...] | list[Op], code: ConvCode | None = None,
              rows: str = "...") -> ConvCode:
    """The epilogue's code on the accumulator's `rows` (all of them, or a chunk of channel rows)."""
    if code is None:
        code = _fresh_code(spec, f"acc_ref[{rows}]", rows)
    for op in ops:
        code.emit(op)
    return code


def _pool_parts(spec: ConvShape) -> tuple[list[Op], list[Op], list[Op]]:
    tainted = depends_on_reduction(list(spec.ops))
    reductions = [op for op in spec.ops if op.prim in REDUCTIONS]
    before = [op for op in spec.ops if op.out.id not in tainted]
    after = [op for op in spec.ops if op.out.id in tainted and op.prim not in REDUCTIONS]
    return before, reductions, after


def _indent(lines: list[str], pad: str) -> str:
    return "\n".join(pad + line for line in lines)


def _epilogue_text(spec: ConvShape) -> tuple[str, list[str]]:
    """The kernel's epilogue and the scratch shapes it needs beyond the patch: before a pool, the chunk loop
    itself, each chunk's epilogue on its convolution's value; otherwise after the conv fills acc_ref.

    Its values are whole rows of positions. Measured on a v5e, walking them instead
    in a rolled loop of 16 rows x 512 positions (a pass per reduction) made 39k 4.4x slower (14.08 ms against
    3.22), 22k 4.5x (36.49 against 8.16) and 33k 1.2x: each small step waits on its own loads and transcendentals,
    where long rows give the scheduler independent work to overlap them with."""
    if spec.mode != POOL:
        # Channel rows are independent (a plane's statistics are one row's), so the epilogue walks the tile
        # EPI_ROWS rows at a time: its f32 temporaries are a slice, not copies of the whole tile in VMEM.
        code = _epilogue(spec, spec.ops, rows="rows, :")
        body = _indent(code.lines, "        ")
        store = (f"        o_ref[rows, :] = jnp.broadcast_to({code.ref(spec.output)}, o_ref[rows, :].shape)"
                 ".astype(o_ref.dtype)\n")
        if writes_planes(spec):  # each channel's wide rows, reshaped and cropped as they are stored
            store = (f"        block = jnp.broadcast_to({code.ref(spec.output)}, (sub, bp))\n"
                     "        block = block.reshape((sub, bp // math.prod(inner)) + inner)\n"
                     "        o_ref[rows] = block[(slice(None), slice(None)) + tuple(slice(0, o) for o in out_inner)]"
                     ".astype(o_ref.dtype)\n")
        return (f"    def _epilogue(r, carry):\n        rows = pl.ds(pl.multiple_of(r * sub, 8), sub)\n{body}\n"
                f"{store}        return carry\n\n"
                "    lax.fori_loop(0, acc_ref.shape[0] // sub, _epilogue, 0)\n"), []
    before, reductions, after = _pool_parts(spec)
    code = _epilogue(spec, before, _fresh_code(spec, "acc"))
    lines = list(code.lines)
    init, carry, partials, keep = [], [], [], []
    for k, op in enumerate(reductions):
        _, identity, combine = REDUCTIONS[op.prim]
        init.append(f"r{k}_ref[...] = jnp.full_like(r{k}_ref, {identity})")
        carry.append(f"jnp.full(r{k}_ref.shape, {identity}, jnp.float32)")
        partials.append(_combined(combine, f"parts[{k}]", code.reduction(op, into_f32=True)))
        keep.append(f"r{k}_ref[...] = {_combined(combine, f'r{k}_ref[...]', f'parts[{k}]')}")
        code.names[op.out.id], code.kinds[op.out.id] = f"r{k}_ref[...]", ROW
    code.lines = []
    _epilogue(spec, after, code)
    text = (f"\n    @pl.when(pi == 0)\n    def _init():\n{_indent(init, '        ')}\n\n"
            "    # A chunk's convolution, then its epilogue on values: unrolled, the MXU's work on one chunk overlaps\n"
            "    # the vector work on another (on a v5e, 39k ran in 2.41 ms this way against 3.96 with the epilogue\n"
            "    # after the whole block's convolution).\n"
            "    def body(c, parts):\n"
            "        local = pl.multiple_of(c * chunk, 128)\n"
            f"        acc = _conv_chunk({_conv_source(spec)}, w_ref, patch_ref, pi * bp + local, offsets, c_in,\n"
            "                          chunk)\n"
            "        mask = m_ref[:, pl.ds(local, chunk)] > 0.5  # the chunk's valid (not wide, not padded) positions\n"
            f"{_indent(lines, '        ')}\n"
            f"        return ({', '.join(partials)},)\n\n"
            f"    parts = lax.fori_loop(0, bp // chunk, body, ({', '.join(carry)},), unroll=min(bp // chunk, 16))\n"
            f"{_indent(keep, '    ')}\n\n"
            f"    @pl.when(pi == pl.num_programs(2) - 1)\n    def _store():\n{_indent(code.lines, '        ')}\n"
            f"        o_ref[...] = jnp.broadcast_to({code.ref(spec.output)}, o_ref.shape).astype(o_ref.dtype)\n")
    return text, ["pltpu.VMEM((bco, 1), jnp.float32)" for _ in reductions]


def _combined(combine: str, left: str, right: str) -> str:
    return f"{left} + {right}" if combine == "+" else f"{combine}({left}, {right})"


def _conv_source(spec: ConvShape) -> str:
    """The ref the convolution's taps read: the sample flattened in VMEM, or the input block as XLA laid it out."""
    return "flat_ref" if flattens_in_vmem(spec) else "x_ref"


def _flops_per_element(spec: ConvShape) -> tuple[int, int]:
    transcendental = sum(op.prim in _TRANSCENDENTAL for op in spec.ops)
    return max(1, len(spec.ops) - transcendental), transcendental


def conv_source(spec: ConvShape, params: ConvParams, header: str, tunable_text: str) -> str:
    """The kernel module: `header` and `tunable_text` (which carries `params` as the TUNABLE values the code
    reads), the helpers, the kernel and the wrapper `computation`."""
    sub_line = "    sub = bco  # the pool's epilogue runs on the whole tile\n" if spec.mode == POOL else \
        "    sub = EPI_ROWS if bco % EPI_ROWS == 0 else bco  # channel rows per epilogue step\n"
    epilogue, reduce_scratch = _epilogue_text(spec)
    needs_mask = spec.mode != TILED
    full_out = value_kind(spec.output.shape, spec.conv_out.shape) == FULL
    refs = ["x_ref", "w_ref"] + [f"e{o.index}_ref" for o in spec.operands] + (["m_ref"] if needs_mask else [])
    n_red = len(reduce_scratch)
    # Rows a whole number of lane tiles long: the kernel flattens the image in VMEM itself, so XLA neither
    # relayouts it to (C, D*H*W) nor pads it in HBM (each a full pass over the input).
    flat = flattens_in_vmem(spec)
    fused = spec.mode == POOL  # the epilogue runs in the chunk loop, on values: no accumulator in VMEM
    scratch_names = ["o_ref"] + ([] if fused else ["acc_ref"]) + ["patch_ref"] + (["flat_ref"] if flat else []) \
        + [f"r{k}_ref" for k in range(n_red)]
    acc_scratch = "" if fused else "pltpu.VMEM((bco, bp), jnp.float32), "
    # Unrolled, one chunk's taps are shifted into the patch while another's dot runs: on a v5e, 8 chunks at a time
    # took 33k from x1.08 to x1.26 of XLA (5.63 ms against 7.09) and 22k from 8.94 to 7.54 ms (XLA 6.15, wall
    # clock); a bf16 patch, its taps shifted without an f32 copy, was slower on both.
    conv_loop = "" if fused else f"""
    def body(c, carry):
        local = pl.multiple_of(c * chunk, 128)
        acc_ref[:, pl.ds(local, chunk)] = _conv_chunk({_conv_source(spec)}, w_ref, patch_ref,
                                                      pi * bp + local, offsets, c_in, chunk)
        return carry

    lax.fori_loop(0, bp // chunk, body, 0, unroll=min(bp // chunk, 8))
"""
    ops_per_element, transcendental = _flops_per_element(spec)
    operand_specs = {ROW: "pl.BlockSpec((bco, 1), lambda n, co, pi: (co, 0))",
                     SCALAR: "pl.BlockSpec((1, 1), lambda n, co, pi: (0, 0))"}
    # A transposed convolution's channels come in phase-major groups: each group repeats the channel rows.
    row = f"jnp.tile(a{{i}}.reshape(-1), {phase_count(spec)})" if spec.phases else "a{i}"
    operand_prep = {ROW: f"_padded({row}.reshape(-1, 1), 0, c_out_p)", SCALAR: "jnp.reshape(a{i}, (1, 1))"}
    prepared = "".join(f"    e{o.index} = {operand_prep[o.kind].format(i=o.index)}\n" for o in spec.operands)
    operand_args = "".join(f", e{o.index}" for o in spec.operands)
    operand_in = "".join(f", {operand_specs[o.kind]}" for o in spec.operands)
    mask_in = ", pl.BlockSpec((1, bp), lambda n, co, pi: (0, pi))" if needs_mask else ""
    mask_arg = ", _valid_mask(in_spatial, out_spatial, p_pad)" if needs_mask else ""
    mask_line = "    mask = m_ref[...] > 0.5  # [1, bp]: the valid (not wide, not padded) positions\n" \
        if needs_mask and not fused else ""
    count = "    count = math.prod(out_spatial)\n"
    to_bf16 = not spec.highest
    mxu = "jnp.bfloat16" if to_bf16 else "jnp.float32"
    precision = "lax.Precision.HIGHEST" if spec.highest else "None"
    if writes_planes(spec):
        out_block = ("pl.BlockSpec((None, bco, rows_blk) + tuple(out_spatial[1:]), "
                     "lambda n, co, pi: (n, co, pi) + (0,) * (len(out_spatial) - 1))")
        out_shape = f"jax.ShapeDtypeStruct((batch, c_out_p) + tuple(out_spatial), jnp.{spec.output.dtype})"
        crop = "", "lax.slice(out, (0,) * out.ndim, (batch, c_out) + tuple(out_spatial))"
    elif full_out:
        out_block = "pl.BlockSpec((None, bco, bp), lambda n, co, pi: (n, co, pi))"
        out_shape = f"jax.ShapeDtypeStruct((batch, c_out_p, p_pad), jnp.{spec.output.dtype})"
        crop = ("    out = lax.slice(out, (0, 0, 0), (batch, c_out, wide)).reshape((batch, c_out, out_spatial[0])\n"
                "                                                                  + in_spatial[1:])\n",
                "lax.slice(out, (0,) * out.ndim, (batch, c_out) + tuple(out_spatial))")
    else:
        out_block = "pl.BlockSpec((None, bco, 1), lambda n, co, pi: (n, co, 0))"
        out_shape = f"jax.ShapeDtypeStruct((batch, c_out_p, 1), jnp.{spec.output.dtype})"
        crop = "", f"lax.slice(out, (0, 0, 0), (batch, c_out, 1)).reshape({_out_shape_expr(spec)})"
    semantics = '("parallel", "arbitrary", "arbitrary")' if flat else \
        '("parallel", "parallel", "arbitrary")' if spec.mode == POOL else '("parallel", "parallel", "parallel")'
    block_p = "p_total" if spec.mode == PLANE else "min(_round_up(BLOCK_P, chunk), p_total)"
    if writes_planes(spec):  # blocks of whole leading rows; the chunk divides them
        unit = row_unit(spec)
        rows = "out_spatial[0]" if spec.mode == PLANE else \
            f"min(out_spatial[0], max({unit}, BLOCK_P // inner // {unit} * {unit}))"
        positions = (f"    inner = math.prod(in_spatial[1:])\n    rows_blk = {rows}\n    bp = rows_blk * inner\n"
                     "    chunk = math.gcd(min(CHUNK, bp), bp)\n    p_total = _round_up(wide, bp)\n")
    else:
        positions = (f"    chunk = min(CHUNK, _round_up(wide, 128))\n    p_total = _round_up(wide, chunk)\n"
                     f"    bp = {block_p}\n")
    if flat:
        flatten = ("\n    @pl.when((pl.program_id(1) == 0) & (pi == 0))\n    def _flatten():  # once per sample: one "
                   "row of positions per channel, zeros past the image and in the padded channels\n"
                   "        flat_ref[...] = jnp.zeros_like(flat_ref)\n"
                   "        c, width = x_ref.shape[0], x_ref.shape[-1]\n"
                   "        lines = x_ref.reshape(c, -1, width) if x_ref.ndim > 3 else x_ref\n\n"
                   "        def _lines(g, carry):  # 8 image rows (all channels) to their places in the flat rows\n"
                   "            group = lines[:, pl.ds(pl.multiple_of(g * 8, 8), 8), :]\n"
                   "            for j in range(8):\n"
                   "                at = pl.multiple_of((g * 8 + j) * width, 128)\n"
                   "                flat_ref[:c, pl.ds(at, width)] = group[:, j, :]\n"
                   "            return carry\n\n"
                   "        lax.fori_loop(0, lines.shape[1] // 8, _lines, 0)\n")
        x_prep = "    xf = x  # flattened in VMEM by the kernel\n"
        x_spec = ("pl.BlockSpec((None, c_in) + tuple(in_spatial), "
                  "lambda n, co, pi: (n,) + (0,) * (len(in_spatial) + 1))")
        flat_scratch = " + [pltpu.VMEM((c_in_p, s_pad), x.dtype)]"
    else:
        flatten = ""
        x_prep = ("    # [N, C_in_p, S_pad]: positions on the lanes; zeros past the end feed only wide or padded "
                  "positions.\n    xf = _padded(_padded(x.reshape(batch, c_in, -1), 1, c_in_p), 2, s_pad)\n")
        x_spec = "pl.BlockSpec((None, c_in_p, s_pad), lambda n, co, pi: (n, 0, 0))"
        flat_scratch = ""
    imports = header.replace("import jax\n", "import functools\nimport itertools\nimport math\n\nimport jax\n", 1)
    return imports + tunable_text + f'''
MODE = {spec.mode!r}  # {dict(tiled="no reduction", pool="a global pool", plane="plane statistics")[spec.mode]}
{to_helper()}{_layout_helpers(spec)}

{_helpers()}


def _conv_chunk(x_ref, w_ref, patch_ref, start, offsets, c_in, chunk):
    """[bco, chunk] f32: the convolution at `chunk` positions from `start` (a multiple of 128)."""
    acc = None
    for t, off in enumerate(offsets):
        base = pl.multiple_of(start + off // 128 * 128, 128)
        # Every tap rolls, even one already aligned (by 0): which taps are aligned depends on the image's row
        # length, and the program must keep one form at every shape (the checked one is the one timed).
        window = x_ref[:, pl.ds(base, chunk + 128)].astype(jnp.float32)
        tap = pltpu.roll(window, (chunk + 128 - off % 128) % (chunk + 128), 1)[:, :chunk]  # window[:, q + off % 128]
        if FOLD_TAPS:
            patch_ref[t * c_in:(t + 1) * c_in, :] = tap
        else:
            part = lax.dot_general(w_ref[t], tap.astype({mxu}), (((1,), (0,)), ((), ())),
                                   precision={precision}, preferred_element_type=jnp.float32)
            acc = part if acc is None else acc + part
    if FOLD_TAPS:
        acc = lax.dot_general(w_ref[...], patch_ref[...].astype({mxu}), (((1,), (0,)), ((), ())),
                              precision={precision}, preferred_element_type=jnp.float32)
    return acc


def _kernel({", ".join(refs)}, {", ".join(scratch_names)}, *, offsets, c_in, chunk, bp, count, sub, inner,
            out_inner):
    pi = pl.program_id(2)
{flatten}{conv_loop}{mask_line}{epilogue}

def computation({", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])}):
    x, w = a{spec.x}, a{spec.w}
{_prologue_text(spec)}    batch, c_in = x.shape[:2]
    c_out = w.shape[0]
    in_spatial, window = x.shape[2:], w.shape[2:]
    out_spatial = tuple(s - k + 1 for s, k in zip(in_spatial, window))
    strides = [math.prod(in_spatial[a + 1:]) for a in range(len(in_spatial))]
    offsets = tuple(sum(i * s for i, s in zip(tap, strides)) for tap in
                    itertools.product(*(range(k) for k in window)))
    wide = out_spatial[0] * strides[0]
{positions}    p_pad = _round_up(p_total, bp)
    c_in_p = _round_up(c_in, 8)
    bco = c_out if c_out <= BLOCK_CO else BLOCK_CO
    c_out_p = _round_up(c_out, bco)
    s_pad = max(math.prod(in_spatial), p_pad + (max(offsets) // 128 + 1) * 128)
{x_prep}
    wt = jnp.moveaxis(_padded(w, 1, c_in_p), 1, -1).reshape(c_out, len(offsets), c_in_p)  # [C_out, taps, C_in]
    wt = _padded(wt, 0, c_out_p).astype({mxu})
    if FOLD_TAPS:
        wt = wt.reshape(c_out_p, len(offsets) * c_in_p)
        w_spec = pl.BlockSpec((bco, len(offsets) * c_in_p), lambda n, co, pi: (co, 0))
    else:
        wt = jnp.moveaxis(wt, 1, 0)  # [taps, C_out, C_in]
        w_spec = pl.BlockSpec((len(offsets), bco, c_in_p), lambda n, co, pi: (0, co, 0))
{prepared}{count}{sub_line}    kernel = functools.partial(_kernel, offsets=offsets, c_in=c_in_p, chunk=chunk, bp=bp,
                               count=count, sub=sub, inner=tuple(in_spatial[1:]),
                               out_inner=tuple(out_spatial[1:]))
    out = pl.pallas_call(
        kernel,
        grid=(batch, c_out_p // bco, p_pad // bp),
        in_specs=[{x_spec}, w_spec{operand_in}{mask_in}],
        out_specs={out_block},
        out_shape={out_shape},
        scratch_shapes=[{acc_scratch}pltpu.VMEM((len(offsets) * c_in_p if FOLD_TAPS else 8, chunk),
                                              jnp.float32)]{flat_scratch}
                       + [{", ".join(reduce_scratch)}],
        compiler_params=pltpu.CompilerParams(dimension_semantics={semantics},
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=2 * batch * c_out * p_pad * len(offsets) * c_in + {ops_per_element} * batch * c_out * p_pad,
            transcendentals={transcendental} * batch * c_out * p_pad,
            bytes_accessed=xf.size * xf.dtype.itemsize + wt.size * wt.dtype.itemsize * batch
            + batch * c_out_p * {"p_pad" if full_out else "1"} * {itemsize(spec.output.dtype)}),
    )(xf, wt{operand_args}{mask_arg})
{_wrapper_end(spec, *crop)}'''



def _wrapper_end(spec: ConvShape, head: str, value: str) -> str:
    """The wrapper's last lines: `head`, then the kernel's value cropped to the reference's shape (`value`, an
    expression), a transposed convolution's output phases interleaved into the reference's layout (its channel count
    and output sizes rebound for the tail), then the reference's tail."""
    lines = []
    if spec.phases or spec.tail:  # both read the cropped value as `out`
        lines.append(f"out = {value}")
        value = "out"
    if spec.phases:
        lines += [f"out = _interleave_phases(out, {spec.phases})", "c_out, out_spatial = out.shape[1], out.shape[2:]"]
    if spec.tail:
        own = ((1, "1"), (spec.batch, "batch"), (spec.conv_out.shape[1], "c_out")) \
            + tuple((d, f"out_spatial[{j}]") for j, d in enumerate(spec.conv_out.shape[2:]))
        tail, value = wrapper_tail(spec.tail, spec.output, spec.inputs, own)
        lines += tail
    return head + "".join(f"    {line}\n" for line in lines) + f"    return {value}\n"


def _prologue_text(spec: ConvShape) -> str:
    """The reference's image padding / dilation and kernel layout steps, done by XLA before the kernel."""
    lines = []
    for pad in spec.x_pads:
        widths = ((0, 0, 0), (0, 0, 0)) + pad
        lines.append(f"    x = lax.pad(x, jnp.zeros((), x.dtype), {widths})  # the reference's padding / dilation")
    for prim, arg in spec.w_steps:
        lines.append(f"    w = lax.rev(w, {arg})" if prim == "rev" else f"    w = jnp.transpose(w, {arg})")
    if spec.strides:
        lines.append(f"    x, w = _space_to_depth(x, w, {spec.strides})  # the reference's strides")
    if spec.phases:
        lines.append(f"    x, w = _stride_phases(x, w, {spec.phases})  # the output phases of its input dilation")
    return "".join(line + "\n" for line in lines)


def _out_shape_expr(spec: ConvShape) -> str:
    """The pooled output's shape as code: (batch, c_out) and as many kept unit axes as the reference has."""
    kept = len(spec.output.shape) - 2
    return "(batch, c_out)" + (f" + (1,) * {kept}" if kept else "")


