"""The scan kernels' source. A prefix sum: a grid over (blocks of lines, chunks along the scan), the chunk axis last
and 'arbitrary'; per chunk the elementwise work before the scan, the chunk's prefix sums as a matmul with a
triangle of ones on the MXU plus the running total in VMEM scratch, then the work after it. A linear recurrence:
the same grid with a loop over the chunk's steps, h carried across chunks in VMEM scratch. The prefix sum's fixed
helpers are real functions in agents.offline.scan.helpers, pasted as their source."""

from __future__ import annotations

from agents.offline.expr import FLOAT_DTYPES, FULL, BlockCode, source_helpers
from agents.offline.helper_text import helper_source
from agents.offline.program import itemsize
from agents.offline.scan.shape import CumsumShape, RecurrenceShape

_HELPERS = "agents.offline.scan.helpers"


def _cumsum_code(spec: CumsumShape, names: dict[int, str]) -> tuple[list[str], str, list[str], str]:
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
    return pre, scanned, code.lines, code.ref(spec.output)


def cumsum_source(spec: CumsumShape, header: str, tunable_text: str) -> str:
    """The prefix-sum kernel module: `header` and `tunable_text` (the TUNABLE block the code reads), the helpers,
    the kernel and the wrapper `computation`."""
    refs = {i: f"x{i}_ref" for i, _, _ in spec.operands}
    pre, scanned, post, result = _cumsum_code(spec, refs)
    body = "\n".join(f"    {line}" for line in pre)
    after = "\n".join(f"    {line}" for line in post)
    full = [i for i, _, kind in spec.operands if kind == FULL]
    lanes = spec.lanes
    ax = 1 if lanes else 0  # the scan's axis inside a block
    if lanes:
        triangle = "_triangle_lanes_reverse" if spec.reverse else "_triangle_lanes"
        prefix = "_prefix_lanes"
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
        triangle = "_triangle_sublanes_reverse" if spec.reverse else "_triangle_sublanes"
        prefix = "_prefix_sublanes"
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

{helper_source(_HELPERS, triangle, prefix, rename={triangle: "_triangle", prefix: "_prefix"})}


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


def recurrence_source(spec: RecurrenceShape, header: str, tunable_text: str) -> str:
    """The recurrence kernel module: `header` and `tunable_text` first, then the kernel and the wrapper."""
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    step = "c - 1 - k" if spec.reverse else "k"
    chunk_index = "nc - 1 - j" if spec.reverse else "j"
    block = f"pl.BlockSpec((None, c, bl), lambda p, q, j: (p, {chunk_index}, q))"
    return header.replace("import jax\n", "import functools\nimport math\n\nimport jax\n", 1) + tunable_text + \
        f'''REVERSE = {spec.reverse!r}
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
    a, x = a{spec.a}, a{spec.x}
    shape = x.shape
    n = shape[{spec.axis}]
    pre = math.prod(shape[:{spec.axis}])
    post = math.prod(shape[{spec.axis + 1}:])
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
        in_specs=[{block}, {block}],
        out_specs={block},
        out_shape=jax.ShapeDtypeStruct((pre, n_p, post_p), jnp.{spec.out_dtype}),
        scratch_shapes=[pltpu.VMEM((1, bl), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=2 * math.prod(shape), transcendentals=0,
            bytes_accessed=a3.size * a3.dtype.itemsize + x3.size * x3.dtype.itemsize
            + math.prod(shape) * {itemsize(spec.out_dtype)}),
    )(a3, x3)
    return out[:, :n, :post].reshape(shape)
'''
