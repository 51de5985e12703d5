"""The flash-attention kernel's source for a recognised attention: a grid over (batch, head group, query block, key
block), the key axis last and 'arbitrary', a running max, sum and f32 accumulator in VMEM. The wrapper reads each
input as its canonical (b, h, s, d) array, or a (b, s, h, d) one in place; the kernel replays the reference's score
ops on each tile. Its fixed helpers are real functions in agents.offline.attention.helpers, pasted as their source.
"""

from __future__ import annotations

import textwrap

from agents.offline.attention.params import AttentionParams
from agents.offline.attention.shape import ROLES, AttentionShape, in_place
from agents.offline.helper_text import helper_source
from agents.offline.program import itemsize

_HELPERS = "agents.offline.attention.helpers"
_WALKS = ("_positions", "_starts", "_ends")  # the grid's walk, in a square causal and a rectangular variant


def _helpers(paired: bool, stacked: bool) -> str:
    """The kernel's helpers before `_kernel`: the mask value, the grid's walk and the tile helpers."""
    variant = "_paired" if paired else "_rectangle"
    walk = tuple(variant + name for name in _WALKS)
    diagonal = "_diagonal_tiles" if stacked else "_diagonal_chunks"
    chunks = ("_each_chunk", diagonal) if paired else ("_each_chunk",)
    return helper_source(_HELPERS, "MASK_VALUE", *walk, "_bias_tile", *chunks, "_causal_mask",
                         rename={variant + name: name for name in _WALKS})


_NAMES = {"b": "batch", "h": "heads", "s": "seq", "d": "dv"}  # the output's role sizes in the wrapper
_SIZE_INDEX = {"b": 0, "h": 1, "s": 2, "d": 3, "q": 2, "k": 3}  # a role's place in its `name`_sizes tuple


def _sizes(name: str, arg: str, order: tuple[str, ...], roles: tuple[str, ...]) -> str:
    """The wrapper's line naming the sizes of an input's roles (1 for a role it lacks)."""
    index = [order.index(r) if r in order else -1 for r in roles]
    return f"    {name}_sizes = tuple({arg}.shape[i] if i >= 0 else 1 for i in {index})\n"


def _prepare(name: str, arg: str, order: tuple[str, ...], roles: tuple[str, ...], lanes: bool = False,
             indent: str = "    ") -> str:
    """The wrapper's line reading an input as the 4-D array of `roles`, or for the (b, s, h, d) layout in place
    as (b, s, h x d), a head's dimension on the lanes."""
    present = [r for r in order if r != "1"]
    if lanes:
        value = f"{arg}.reshape({name}_sizes[0], {name}_sizes[2], {name}_sizes[1] * {name}_sizes[3])"
    else:
        shape = "(" + ", ".join(f"{name}_sizes[{_SIZE_INDEX[r]}]" for r in roles) + ",)"
        if present == [r for r in roles if r in present]:
            value = f"{arg}.reshape({shape})"
        else:
            keep = [i for i, r in enumerate(order) if r != "1"]
            perm = [present.index(r) for r in roles if r in present]
            value = f"jnp.transpose({arg}.reshape([{arg}.shape[i] for i in {keep}]), {perm}).reshape({shape})"
    return f"{indent}{name} = {value}\n"


def _finish(spec: AttentionShape, lanes: bool) -> str:
    """The wrapper's last lines: the kernel's output in the reference's layout and shape."""
    final = "(" + ", ".join(" * ".join(_NAMES[r] for r in roles) or "1" for roles in spec.out_dims) + ",)"
    if lanes:
        return f"    return out.reshape({final})"
    names = [r for r in spec.out_order if r != "1"]
    present = [r for r in ROLES if r in names]
    return (f"    out = out.reshape({'(' + ', '.join(_NAMES[r] for r in present) + ',)'})\n"
            f"    return jnp.transpose(out, {[present.index(r) for r in names]}).reshape({final})")


def _bias_spec(order: tuple[str, ...]) -> str:
    """The bias's block over its 4-D (b, h, q, k) array and its index map (size-1 axes broadcast in the kernel)."""
    present = {r for r in order if r != "1"}
    block = ", ".join(["None", "hb" if "h" in present else "1", "block_q" if "q" in present else "1",
                       "block_kv" if "k" in present else "1"])
    index = ", ".join(["b" if "b" in present else "0", "hh" if "h" in present else "0",
                       "q_at(i, j)" if "q" in present else "0", "kv_at(i, j)" if "k" in present else "0"])
    return f"pl.BlockSpec(({block}), lambda b, hh, i, j: ({index}))"


# The running sum and accumulator from the VPU's row sums (`v` is the block's first `keys` rows of V).
_VPU_SUM = '''l_ref[at, :] = alpha * l_ref[at, :] + jnp.sum(p, axis=-1, keepdims=True)
pv = lax.dot_general(p{cast}, v, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
acc_ref[at, :] = alpha * acc_ref[at, :] + pv
'''
# Or, where V is whole lane tiles wide, from the MXU as the TUNABLE value says.
_MXU_OR_VPU_SUM = '''if ROW_SUMS_ON_MXU:  # p @ [V | 1]: the row sums come out of the MXU beside the output
    vv = jnp.concatenate([v, jnp.ones_like(v)], axis=1)
    pv = lax.dot_general(p{cast}, vv, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
    l_ref[at, :] = alpha * l_ref[at, :] + pv[:, dv:dv + 1]
    acc_ref[at, :] = alpha * acc_ref[at, :] + pv[:, :dv]
else:
''' + textwrap.indent(_VPU_SUM, "    ")


def _sum_lines(spec: AttentionShape, cast: str, stacked: bool) -> str:
    """The chunk's lines updating the running sum and accumulator from p."""
    body = _MXU_OR_VPU_SUM if spec.v_dim % 128 == 0 else _VPU_SUM
    v = "v_ref[bi, :keys, :]" if stacked else "v_ref[:keys, :]"
    return textwrap.indent(f"v = {v}\n" + body.format(cast=cast), " " * 8)


def _score_lines(spec: AttentionShape) -> list[str]:
    """The kernel's lines replaying the reference's ops on a chunk's score tile `s` (a leading scale went on q)."""
    lines, leading = [], spec.folded_scale != 1.0
    offset = "r0" if spec.square_causal else "r0 + qi * block_q - kv * block_kv"
    for op in spec.score_ops:
        if op.kind == "scale" and leading:
            continue
        leading = False
        if op.kind == "scale":
            lines.append(f"        s = s * {op.value!r}")
        elif op.kind == "bias":
            lines.append("        s = s + _bias_tile(bias_ref, h, r0, rows, keys)")
        else:
            lines.append(f"        s = _causal_mask(s, {offset}) if masked else s")
    return lines


def _walk_lines(spec: AttentionShape, stacked: bool) -> str:
    """The kernel's lines running `chunk` over the block's stacked tiles (heads, or batch elements x heads): on a
    square causal grid the blocks below the diagonal unmasked and the diagonal's cut to the keys each chunk of
    rows sees."""
    tiles = "bb * hb" if stacked else "hb"
    if spec.square_causal:
        return (f'''    @pl.when(kv != qi)
    def _below():  # every key before every query: no mask
        _each_chunk(chunk, {tiles}, block_q // rows, rows, block_kv, False)

    @pl.when(kv == qi)
    def _diagonal():
        {"_diagonal_tiles" if stacked else "_diagonal_chunks"}(chunk, {tiles}, block_q // rows, rows, block_kv)
''')
    return f"    _each_chunk(chunk, {tiles}, block_q // rows, rows, block_kv, {spec.causal})\n"


def attention_source(spec: AttentionShape, params: AttentionParams, header: str, tunable_text: str) -> str:
    """The kernel module: `header` and `tunable_text` (which carries `params` as the TUNABLE values the code
    reads), the helpers, the kernel and the wrapper `computation`."""
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    cast = ".astype(v_ref.dtype)" if spec.v_dtype in ("bfloat16", "float16") else ""
    paired = spec.square_causal
    folded = spec.folded_scale
    q_lanes, k_lanes = in_place(spec.q_order, spec.head_dim), in_place(spec.k_order, spec.head_dim)
    v_lanes, o_lanes = in_place(spec.v_order, spec.v_dim), in_place(spec.out_order, spec.v_dim)
    bias = spec.bias is not None
    # Batch elements stacked in a step (BATCH_PER_STEP): every block but the bias's gains a leading batch axis,
    # and the kernel's stacked tile g is batch element g // hb, head g % hb.
    stacked = params.batch_per_step is not None
    lead = "bb" if stacked else "None"
    q_read = ("q_ref[pl.ds(r0, rows), h * d:(h + 1) * d]" if q_lanes
              else "q_ref[bi, h, pl.ds(r0, rows), :]" if stacked else "q_ref[h, pl.ds(r0, rows), :]")
    k_rows, k_cols = ("k_ref[bi, :keys, :]", "k_ref[bi, :, :keys]") if stacked else ("k_ref[:keys, :]",
                                                                                    "k_ref[:, :keys]")
    if folded != 1.0:
        q_read = f"({q_read}.astype(jnp.float32) * {folded!r}).astype(q_ref.dtype)"
    store = ("        for h in range(hb):\n"
             "            o_ref[:, h * dv:(h + 1) * dv] = out[h * block_q:(h + 1) * block_q].astype(o_ref.dtype)"
             if o_lanes else "        o_ref[...] = out.reshape(o_ref.shape).astype(o_ref.dtype)")
    q_spec = ("pl.BlockSpec((None, block_q, hb * d), lambda b, hh, i, j: (b, q_at(i, j), hh))" if q_lanes
              else f"pl.BlockSpec(({lead}, hb, block_q, d), lambda b, hh, i, j: (b, hh, q_at(i, j), 0))")
    k_spec = ("pl.BlockSpec((None, block_kv, d), lambda b, hh, i, j: (b, kv_at(i, j), kv_head(hh)))" if k_lanes
              else f"pl.BlockSpec(({lead}, None, block_kv, d), lambda b, hh, i, j: (b, kv_head(hh), kv_at(i, j), 0))")
    v_spec = ("pl.BlockSpec((None, block_kv, dv), lambda b, hh, i, j: (b, kv_at(i, j), kv_head(hh)))" if v_lanes
              else f"pl.BlockSpec(({lead}, None, block_kv, dv), lambda b, hh, i, j: (b, kv_head(hh), kv_at(i, j), 0))")
    o_spec = ("pl.BlockSpec((None, block_q, hb * dv), lambda b, hh, i, j: (b, q_at(i, j), hh))" if o_lanes
              else f"pl.BlockSpec(({lead}, hb, block_q, dv), lambda b, hh, i, j: (b, hh, q_at(i, j), 0))")
    o_shape = "(batch, seq, heads * dv)" if o_lanes else "(batch, heads, seq, dv)"
    bias_prepare = (_sizes("bias", f"a{spec.bias}", spec.bias_order, ("b", "h", "q", "k"))
                    + _prepare("bias", f"a{spec.bias}", spec.bias_order, ("b", "h", "q", "k"))) if bias else ""
    bias_in_spec = f", {_bias_spec(spec.bias_order)}" if bias else ""
    bias_reads = "batch // bb" if stacked else "batch"
    bias_bytes = f" + bias.size * bias.dtype.itemsize * ({bias_reads} if bias_sizes[0] == 1 else 1)" if bias else ""
    halve = 2 if spec.causal else 1
    steps = "batch // bb" if stacked else "batch"
    grid = f"({steps}, heads // hb, (n_q + 1) // 2, n_q + 1)" if paired else f"({steps}, heads // hb, n_q, n_kv)"
    sums = _sum_lines(spec, cast, stacked)
    tiles = "bb * hb" if stacked else "hb"
    tile, tile_name = ("g", "tile g") if stacked else ("h", "head h")
    kernel_args = ("block_q=block_q, block_kv=block_kv, hb=hb, bb=bb, d=d, dv=dv, n_q=n_q,\n"
                   "                       rows=rows" if stacked else
                   "block_q=block_q, block_kv=block_kv, hb=hb, d=d, dv=dv, n_q=n_q, rows=rows")
    scratch = (f"[pltpu.VMEM(({tiles} * block_q, 1), jnp.float32), pltpu.VMEM(({tiles} * block_q, 1), jnp.float32),\n"
               f"                        pltpu.VMEM(({tiles} * block_q, dv), jnp.float32)]")
    score_lines = "\n".join(_score_lines(spec))
    return header + tunable_text + f'''
{_helpers(paired, stacked)}


def _kernel(q_ref, k_ref, v_ref, {"bias_ref, " if bias else ""}o_ref, m_ref, l_ref, acc_ref, *, block_q, block_kv, hb,
            {"bb, " if stacked else ""}d, dv, n_q, rows):
    i, j = pl.program_id(2), pl.program_id(3)
    qi, kv = _positions(i, j, n_q)

    @pl.when(_starts(i, j, qi, kv))
    def _init():
        m_ref[...] = jnp.full_like(m_ref, MASK_VALUE)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    def chunk({tile}, r0, keys, masked):
        """Query rows r0 .. r0 + rows of stacked {tile_name} against the block's first `keys` keys."""
{"        bi, h = g // hb, g % hb  # the stacked tile's batch element and head" + chr(10) if stacked else ""}\
        q = {q_read}  # [rows, d]
        if TRANSPOSE_K:
            s = lax.dot_general(q, {k_cols}, (((1,), (0,)), ((), ())), preferred_element_type=jnp.float32)
        else:
            s = lax.dot_general(q, {k_rows}, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
{score_lines}
        at = pl.ds({tile} * block_q + r0, rows)  # the chunk's rows of the running max, sum and accumulator
        m_prev = m_ref[at, :]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        alpha = jnp.exp(m_prev - m_new)
{sums}        m_ref[at, :] = m_new

{_walk_lines(spec, stacked)}
    @pl.when(_ends(i, j, qi, kv))
    def _store():
        out = acc_ref[...] / l_ref[...]  # [{tiles} * block_q, dv]
{store}


{helper_source(_HELPERS, "_block")}


def computation({args}):
{_sizes("q", f"a{spec.q}", spec.q_order, ROLES)}{_sizes("k", f"a{spec.k}", spec.k_order, ROLES)}\
{_sizes("v", f"a{spec.v}", spec.v_order, ROLES)}{_prepare("q", f"a{spec.q}", spec.q_order, ROLES, q_lanes)}\
{_prepare("v", f"a{spec.v}", spec.v_order, ROLES, v_lanes)}{bias_prepare}    batch, heads, seq, d = q_sizes
    kv_heads, kv_seq, dv = k_sizes[1], k_sizes[2], v_sizes[3]
    group = heads // kv_heads
    hb = HEADS_PER_STEP if group % HEADS_PER_STEP == 0 else 1
{"    bb = BATCH_PER_STEP if batch % BATCH_PER_STEP == 0 else 1" + chr(10) if stacked else ""}\
    block_q = _block(seq, BLOCK_Q)
    block_kv = {"block_q" if paired else "_block(kv_seq, BLOCK_KV)"}
    rows = CHUNK_ROWS if block_q % CHUNK_ROWS == 0 else block_q
    if seq % block_q or kv_seq % block_kv:
        raise ValueError(f"sequence lengths {{seq}}, {{kv_seq}} are not multiples of 128")
    n_q, n_kv = seq // block_q, kv_seq // block_kv

    def q_at(i, j):
        return _positions(i, j, n_q)[0]

    def kv_at(i, j):
        return _positions(i, j, n_q)[1]

    def kv_head(hh):
        return lax.div(hh * hb, group)

    if TRANSPOSE_K:
{_prepare("k", f"a{spec.k}", spec.k_order, ("b", "h", "d", "s"), indent="        ")}\
        k_spec = pl.BlockSpec(({lead}, None, d, block_kv), lambda b, hh, i, j: (b, kv_head(hh), 0, kv_at(i, j)))
    else:
{_prepare("k", f"a{spec.k}", spec.k_order, ROLES, k_lanes, indent="        ")}\
        k_spec = {k_spec}

    def kernel(*refs):
        return _kernel(*refs, {kernel_args})

    out = pl.pallas_call(
        kernel,
        grid={grid},
        in_specs=[{q_spec}, k_spec,
                  {v_spec}{bias_in_spec}],
        out_specs={o_spec},
        out_shape=jax.ShapeDtypeStruct({o_shape}, jnp.{spec.out_dtype}),
        scratch_shapes={scratch},
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
            vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(
            flops=2 * batch * heads * seq * kv_seq * (d + dv) // {halve},
            transcendentals=batch * heads * seq * kv_seq // {halve},
            bytes_accessed=(q.size + (k.size + v.size) * n_q * (heads // hb) // kv_heads // {halve})
            * q.dtype.itemsize + batch * heads * seq * dv * {itemsize(spec.out_dtype)}{bias_bytes}),
    )(q, k, v{", bias" if bias else ""})
{_finish(spec, o_lanes)}
'''
