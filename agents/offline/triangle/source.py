"""The triangle update's source: three pallas_calls (the projections channel-major, the per-channel contraction,
the normalisation with the output projection and its gate), f32 inside each, rounded to the reference's dtype
where the reference's values are stored (left, right, t), enter the MXU, or are rounded by an explicit cast."""

from __future__ import annotations

from agents.offline.triangle.shape import Projection, TriangleParams, TriangleShape


def _stacked(spec: TriangleShape) -> tuple[list[int], dict[str, tuple[int, int | None, bool]]]:
    """The projection weights stacked into one dot (input indices: the values, then the gates) and each
    projection's blocks of rows in it: (value block, gate block or None, masked)."""
    projections = {"left": spec.left, "right": spec.right}
    order = [p.value for p in projections.values()] + [p.gate for p in projections.values() if p.gate is not None]
    rows = {name: (order.index(p.value), None if p.gate is None else order.index(p.gate), p.masked)
            for name, p in projections.items()}
    return order, rows


def _gate_args(out: Projection) -> tuple[str, str]:
    return ("x_ref, ", "wg_ref, ") if out.gate is not None else ("", "")


def triangle_source(spec: TriangleShape, params: TriangleParams, header: str, tunable_text: str) -> str:
    """The kernel module: `header` and `tunable_text` (which carries `params` as the TUNABLE values the code
    reads), the three kernels and the wrapper `computation`."""
    del params  # the written module reads its TUNABLE values
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    order, rows = _stacked(spec)
    mask_ref = "m_ref, " if spec.mask is not None else ""
    x_arg, wg_arg = _gate_args(spec.out)
    s_arg = "s_ref, " if spec.scale is not None else ""
    proj_in_specs = ["pl.BlockSpec((rows, c_in), lambda i: (i, 0))"] \
        + (["pl.BlockSpec((1, rows), lambda i: (0, i))"] if spec.mask is not None else []) \
        + ["pl.BlockSpec(weights.shape, lambda i: (0, 0))"]
    gap = ",\n                  "
    mask_val = f"a{spec.mask}.reshape(1, p), " if spec.mask is not None else ""
    out_in_specs = ["pl.BlockSpec((c, rows), lambda i: (0, i))"]
    out_vals = ["t.reshape(c, p)"]
    if spec.out.gate is not None:
        out_in_specs.append("pl.BlockSpec((rows, c_in), lambda i: (i, 0))")
        out_vals.append("xf")
    if spec.scale is not None:
        out_in_specs.append("pl.BlockSpec((c, 1), lambda i: (0, 0))")
        out_vals.append(f"a{spec.scale}.reshape(c, 1)")
    out_in_specs.append("pl.BlockSpec((c, c_out), lambda i: (0, 0))")
    out_vals.append(f"a{spec.out.value}")
    if spec.out.gate is not None:
        out_in_specs.append("pl.BlockSpec((c_in, c_out), lambda i: (0, 0))")
        out_vals.append(f"a{spec.out.gate}")
    scaled = "    normed = normed * s_ref[...].astype(jnp.float32)  # [C, 1]: the reference's scale\n" \
        if spec.scale is not None else ""
    gated = ("    a = a * jax.nn.sigmoid(lax.dot_general(x_ref[...], wg_ref[...], (((1,), (0,)), ((), ())),\n"
             "                                         preferred_element_type=jnp.float32))\n"
             if spec.out.gate is not None else "")
    gates = sum(g is not None for g in (spec.left.gate, spec.right.gate))
    # Outgoing edges contract each operand's second axis (rows of it a block); incoming, the first (columns).
    shared = 0 if spec.incoming else 1
    contraction = ("t[c, i, j] = sum_k left[c, k, i] right[c, k, j]" if spec.incoming else
                   "t[c, i, j] = sum_k left[c, i, k] right[c, j, k]")
    operand_specs = gap.join(
        [f"pl.BlockSpec((None, n, {b}), lambda h, i, j: (h, 0, {a}))" for a, b in (("i", "bi"), ("j", "bj"))]
        if spec.incoming else
        [f"pl.BlockSpec((None, {b}, n), lambda h, i, j: (h, {a}, 0))" for a, b in (("i", "bi"), ("j", "bj"))])
    gate_in = "c_in" if spec.out.gate is not None else "0"  # the output gate's own projection of x
    header = header.replace("import jax\n", "import math\n\nimport jax\n", 1)
    return header + tunable_text + f'''
EPS = {spec.eps!r}  # added to the mean square before its root
# The projections' weights stacked into one dot, and each projection's blocks of its rows: (value, gate, masked).
STACKED = {tuple(order)!r}
LEFT = {rows["left"]!r}
RIGHT = {rows["right"]!r}


def _projected(y, c, rows, mask):
    """One projection from the stacked dot's f32 rows: its value, times its sigmoid gate and the mask."""
    value, gate, masked = rows
    v = y[value * c:(value + 1) * c]
    if gate is not None:
        v = v * jax.nn.sigmoid(y[gate * c:(gate + 1) * c])
    if masked:
        v = v * mask
    return v


def _projection_kernel(x_ref, {mask_ref}w_ref, l_ref, r_ref):
    """left and right for a block of positions, channel-major: W^T x^T on the MXU gives [channels, positions]."""
    c = l_ref.shape[0]
    y = lax.dot_general(w_ref[...], x_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    mask = {"m_ref[...].astype(jnp.float32)  # [1, positions]" if spec.mask is not None else "None"}
    l_ref[...] = _projected(y, c, LEFT, mask).astype(l_ref.dtype)
    r_ref[...] = _projected(y, c, RIGHT, mask).astype(r_ref.dtype)


def _contraction_kernel(l_ref, r_ref, t_ref):
    """{contraction} for one channel's block, the whole shared axis in one dot."""
    t_ref[...] = lax.dot_general(l_ref[...], r_ref[...], ((({shared},), ({shared},)), ((), ())),
                                 preferred_element_type=jnp.float32).astype(t_ref.dtype)


def _output_kernel(t_ref, {x_arg}{s_arg}wo_ref, {wg_arg}o_ref):
    """A block of positions: t RMS-normalised over its channels, projected (contracting the channel axis, so the
    result comes out position-major, the reference's layout), times the gate."""
    t = t_ref[...].astype(jnp.float32)  # [C, positions]
    ms = jnp.mean(t * t, axis=0, keepdims=True)
    normed = (t * lax.rsqrt(ms + EPS)).astype(t_ref.dtype).astype(jnp.float32)
{scaled}    a = lax.dot_general(normed.astype(wo_ref.dtype), wo_ref[...], (((0,), (0,)), ((), ())),
                        preferred_element_type=jnp.float32)
{gated}    o_ref[...] = a.astype(o_ref.dtype)


def computation({args}):
    x = a{spec.x}
    n, _, c_in = x.shape
    p = n * n
    c, c_out = a{spec.left.value}.shape[1], a{spec.out.value}.shape[1]
    xf = x.reshape(p, c_in)
    weights = jnp.concatenate([a{", a".join(str(w) for w in order)}], axis=1).T  # [projections x C, C_in]
    # Blocks that divide what they tile at any shape the module is called with (the search's values were chosen
    # at the production shape): the gcd keeps a multiple of 128 where the residues are one.
    rows = math.gcd(min(BLOCK_ROWS, p), p)
    per_rows = pltpu.CompilerParams(dimension_semantics=("parallel",), vmem_limit_bytes=VMEM_LIMIT_BYTES)
    left, right = pl.pallas_call(
        _projection_kernel,
        grid=(p // rows,),
        in_specs=[{gap.join(proj_in_specs)}],
        out_specs=[pl.BlockSpec((c, rows), lambda i: (0, i))] * 2,
        out_shape=[jax.ShapeDtypeStruct((c, p), x.dtype)] * 2,
        compiler_params=per_rows,
        cost_estimate=pl.CostEstimate(flops=2 * p * c_in * weights.shape[0], transcendentals=p * c * {gates},
                                      bytes_accessed=(p * c_in + 2 * p * c) * x.dtype.itemsize),
    )(xf, {mask_val}weights)
    bi, bj = math.gcd(min(BLOCK_I, n), n), math.gcd(min(BLOCK_J, n), n)
    t = pl.pallas_call(
        _contraction_kernel,
        grid=(c, n // bi, n // bj),
        in_specs=[{operand_specs}],
        out_specs=pl.BlockSpec((None, bi, bj), lambda h, i, j: (h, i, j)),
        out_shape=jax.ShapeDtypeStruct((c, n, n), x.dtype),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",) * 3,
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(flops=2 * c * n ** 3, transcendentals=0,
                                      bytes_accessed=(p * c + p * c * (n // bi) + p * c) * x.dtype.itemsize),
    )(left.reshape(c, n, n), right.reshape(c, n, n))
    out = pl.pallas_call(
        _output_kernel,
        grid=(p // rows,),
        in_specs=[{gap.join(out_in_specs)}],
        out_specs=pl.BlockSpec((rows, c_out), lambda i: (i, 0)),
        out_shape=jax.ShapeDtypeStruct((p, c_out), jnp.{spec.out_dtype}),
        compiler_params=per_rows,
        cost_estimate=pl.CostEstimate(flops=2 * p * c_out * (c + {gate_in}), transcendentals=p * c_out,
                                      bytes_accessed=(p * c + p * {gate_in} + p * c_out) * x.dtype.itemsize),
    )({", ".join(out_vals)})
    return out.reshape(n, n, c_out)
'''
