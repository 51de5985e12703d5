"""The mixture-of-experts kernel's source: the reference's routing as XLA ops, then the tokens' chosen experts
only, as two grouped matmuls over rows sorted by expert.

The wrapper repeats the reference's routing ops (the same XLA ops, so the same choices), takes each token's top-k
experts and weights from them, sorts the (token, expert) pairs by expert and places each expert's pairs from a
tile boundary (tiles of BLOCK_ROWS rows, one expert each; the last tile of an expert padded). The first
pallas_call computes, per tile, the experts' first matmuls on the tile's gathered tokens and the activation between
them ([rows, ffn] in blocks of BLOCK_FFN); the second the last matmul ([rows, model] in blocks of BLOCK_MODEL,
accumulated over BLOCK_FFN_DOWN). The tile's expert comes in by scalar prefetch and picks the weight blocks; tiles
past the routed rows do no work and fetch nothing new. Each token's output is its experts' outputs, rounded as the
reference rounds them, times their weights, summed in f32."""

from __future__ import annotations

from agents.offline.expr import BINARY, UNARY, literal
from agents.offline.moe.shape import MoEShape
from agents.offline.program import Op, Value
from agents.offline.tail import wrapper_tail

_SMALL_FLOATS = ("bfloat16", "float16")


def _rounded(expr: str, dtype: str) -> str:
    return f"_round({expr}, jnp.{dtype})" if dtype in _SMALL_FLOATS else expr


def chain_lines(chain: tuple[Op, ...], names: dict[int, str]) -> tuple[list[str], str]:
    """The activation's ops on f32 tiles, each rounded where the reference's dtype rounds it."""
    names = dict(names)
    lines = []
    for op in chain:
        args = [names[a.id] if isinstance(a, Value) else literal(a) for a in op.args]
        if op.prim in UNARY:
            expr = UNARY[op.prim].format(*args)
        elif op.prim in BINARY:
            expr = BINARY[op.prim].format(*args)
        elif op.prim == "integer_pow":
            expr = f"lax.integer_pow({args[0]}, {int(op.params['y'])})"
        else:  # a cast between float dtypes: the rounding below is all it does
            expr = args[0]
        name = f"v{op.out.id}"
        lines.append(f"{name} = {_rounded(expr, op.out.dtype)}")
        names[op.out.id] = name
    return lines, names[chain[-1].out.id] if chain else ""


def moe_source(spec: MoEShape, header: str, tunable_text: str) -> str:
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    routing, combine = wrapper_tail(spec.routing, spec.combine, spec.inputs, ())
    routing_text = "\n".join(f"    {line}" for line in routing)
    n_in = len(spec.ins)
    w_refs = ", ".join(f"w{j}_ref" for j in range(n_in))
    firsts, names = [], {}
    for j, e in enumerate(spec.ins):
        contract = "(((1,), (1,)), ((), ()))" if e.transposed else "(((1,), (0,)), ((), ()))"
        expr = f"lax.dot_general(x, w{j}_ref[...], {contract}, preferred_element_type=jnp.float32)"
        for dtype in e.rounds:
            expr = _rounded(expr, dtype)
        firsts.append(f"g{j} = {expr}")
        names[e.value.id] = f"g{j}"
    chain, hidden = chain_lines(spec.chain, names)
    body = "\n".join(f"        {line}" for line in firsts + chain)
    w_blocks = ", ".join(
        ("pl.BlockSpec((None, block_ffn, model), lambda i, j, ex, used: (ex[i], _last(i, used, j, nf), 0))"
         if e.transposed else
         "pl.BlockSpec((None, model, block_ffn), lambda i, j, ex, used: (ex[i], 0, _last(i, used, j, nf)))")
        for e in spec.ins)
    w_args = ", ".join(f"a{e.weight}" for e in spec.ins)
    down_contract = "(((1,), (1,)), ((), ()))" if spec.down_transposed else "(((1,), (0,)), ((), ()))"
    down_block = ("pl.BlockSpec((None, block_model, block_down), "
                  "lambda i, n, k, ex, used: (ex[i], _last(i, used, n, nn), _last(i, used, k, nk)))"
                  if spec.down_transposed else
                  "pl.BlockSpec((None, block_down, block_model), "
                  "lambda i, n, k, ex, used: (ex[i], _last(i, used, k, nk), _last(i, used, n, nn)))")
    return header + tunable_text + f'''

def _round(v, dtype):
    """An f32 value rounded to the reference's dtype and back: the kernel rounds where the reference does."""
    return v.astype(dtype).astype(jnp.float32)


def _fit(size, want):
    """The largest block up to `want` that divides `size` in multiples of 128 (all of it when none does)."""
    b = min(want, size) - min(want, size) % 128
    while b >= 128 and size % b:
        b -= 128
    return b if b >= 128 else size


def _last(i, used, j, n):
    """A block index that, past the routed tiles, stays where the last routed tile ended: nothing new fetched."""
    return jnp.where(i < used[0], j, n - 1)


def _first_kernel(ex_ref, used_ref, x_ref, {w_refs}, h_ref):
    i = pl.program_id(0)

    @pl.when(i < used_ref[0])
    def _tile():
        x = x_ref[...]
{body}
        h_ref[...] = {hidden}.astype(h_ref.dtype)

    @pl.when(i >= used_ref[0])
    def _past():  # never read; written so that nothing uninitialised leaves the kernel
        h_ref[...] = jnp.zeros_like(h_ref)


def _down_kernel(ex_ref, used_ref, h_ref, w_ref, y_ref, acc_ref):
    i, k = pl.program_id(0), pl.program_id(2)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(i < used_ref[0])
    def _tile():
        acc_ref[...] += lax.dot_general(h_ref[...], w_ref[...], {down_contract},
                                        preferred_element_type=jnp.float32)

    @pl.when(k == pl.num_programs(2) - 1)
    def _store():
        y_ref[...] = acc_ref[...].astype(y_ref.dtype)


def _route(combine, experts, top_k, block_rows):
    """Each token's top-k experts and weights, and the rows of the expert-sorted layout: per row its token, per
    (token, choice) its row, per tile its expert, and how many tiles hold routed rows."""
    weights, chosen = lax.top_k(combine.reshape(experts, -1).T, top_k)  # [tokens, top_k]
    pairs = chosen.reshape(-1)
    order = jnp.argsort(pairs, stable=True)
    sizes = jnp.bincount(pairs, length=experts)
    padded = (sizes + block_rows - 1) // block_rows * block_rows
    padded_end = jnp.cumsum(padded)
    by_expert = pairs[order]
    rank = jnp.arange(pairs.size) - (jnp.cumsum(sizes) - sizes)[by_expert]
    row_sorted = (padded_end - padded)[by_expert] + rank
    n_tiles = pairs.size // block_rows + experts
    row_of_pair = jnp.zeros_like(pairs).at[order].set(row_sorted)
    token_of_row = jnp.zeros((n_tiles * block_rows,), jnp.int32).at[row_sorted].set(order // top_k)
    used = padded_end[-1] // block_rows
    tile_start = jnp.arange(n_tiles) * block_rows
    tile_expert = jnp.minimum(jnp.searchsorted(padded_end, tile_start, side="right"), experts - 1)
    tile_expert = jnp.where(jnp.arange(n_tiles) < used, tile_expert,
                            tile_expert[jnp.maximum(used - 1, 0)]).astype(jnp.int32)
    return weights, row_of_pair, token_of_row, tile_expert, used.reshape(1).astype(jnp.int32), n_tiles


def computation({args}):
    x = a{spec.tokens_input}
    experts, top_k = {spec.experts}, {spec.top_k}
    model, ffn = x.shape[-1], a{spec.down}.shape[{2 if spec.down_transposed else 1}]
    # The reference's routing, op for op: the weight of each expert for each token, zero but for top_k of them.
{routing_text}
    block_rows = BLOCK_ROWS
    weights, row_of_pair, token_of_row, tile_expert, used, n_tiles = _route({combine}, experts, top_k, block_rows)
    rows = x.reshape(-1, model)[token_of_row]  # the tokens in expert order, [n_tiles * block_rows, model]
    block_ffn, block_model, block_down = _fit(ffn, BLOCK_FFN), _fit(model, BLOCK_MODEL), _fit(ffn, BLOCK_FFN_DOWN)
    nf, nn, nk = ffn // block_ffn, model // block_model, ffn // block_down
    size = jnp.dtype(x.dtype).itemsize
    routed = rows.shape[0]
    hidden = pl.pallas_call(
        _first_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(n_tiles, nf),
            in_specs=[pl.BlockSpec((block_rows, model), lambda i, j, ex, used: (jnp.minimum(i, used[0] - 1), 0)),
                      {w_blocks}],
            out_specs=pl.BlockSpec((block_rows, block_ffn), lambda i, j, ex, used: (i, j)),
        ),
        out_shape=jax.ShapeDtypeStruct((routed, ffn), jnp.{spec.hidden.dtype}),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(flops=2 * {n_in} * routed * model * ffn, transcendentals=routed * ffn,
                                      bytes_accessed=(routed * (model + ffn) + n_tiles * {n_in} * model * ffn) * size),
    )(tile_expert, used, rows, {w_args})
    out = pl.pallas_call(
        _down_kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(n_tiles, nn, nk),
            in_specs=[pl.BlockSpec((block_rows, block_down),
                                   lambda i, n, k, ex, used: (jnp.minimum(i, used[0] - 1), _last(i, used, k, nk))),
                      {down_block}],
            out_specs=pl.BlockSpec((block_rows, block_model), lambda i, n, k, ex, used: (i, n)),
            scratch_shapes=[pltpu.VMEM((block_rows, block_model), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((routed, model), jnp.{spec.down_dtype}),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(flops=2 * routed * model * ffn, transcendentals=0,
                                      bytes_accessed=(routed * (ffn * nn + model) + n_tiles * model * ffn) * size),
    )(tile_expert, used, hidden, a{spec.down})
    # Each token's chosen experts' outputs, as the reference casts them, times their weights, summed in f32.
    picked = out[row_of_pair].reshape(-1, top_k, model).astype(jnp.float32)
    total = jnp.sum(picked * weights[..., None], axis=1)
    return total.astype(jnp.{spec.out_dtype}).reshape(*x.shape[:-1], model)
'''
