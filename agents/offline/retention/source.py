"""The retention kernel's source: two pallas_calls over (batch x heads, row of the paired causal walk, step), the
step axis last and 'arbitrary', each visiting the blocks on or below the diagonal. The first sums each row's weighted
scores' absolute values and writes the factor the row is multiplied by (the decay's query factor over the floored
sum); the second computes the scores again, normalises and rounds them as the reference does, and multiplies them by
V into an f32 accumulator. Rounding the scores after normalising, as the reference does, keeps the outputs within a
rounding of the reference's on any inputs (a single pass rounds them before and differs by more where the output
cancels). The causal walk is attention's (agents.offline.attention.helpers), pasted in with the decay's helpers."""

from __future__ import annotations

from agents.offline.helper_text import helper_source
from agents.offline.program import itemsize
from agents.offline.retention.shape import RetentionParams, RetentionShape

_WALK = {f"_paired{name}": name for name in ("_positions", "_starts", "_ends")}


def retention_source(spec: RetentionShape, params: RetentionParams, header: str, tunable_text: str) -> str:
    """The kernel module: `header` and `tunable_text` (which carries `params` as the TUNABLE values the code
    reads), the decay's rates, the helpers, the kernel and the wrapper `computation`."""
    del params  # the written module reads its TUNABLE values
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    cast = ".astype(v_ref.dtype)" if spec.v_dtype in ("bfloat16", "float16") else ""
    rates = ",\n    ".join(", ".join(repr(r) for r in spec.rates[i:i + 4]) for i in range(0, len(spec.rates), 4))
    walk = helper_source("agents.offline.attention.helpers", *_WALK, rename=_WALK)
    decay = helper_source("agents.offline.retention.helpers", "_column_decay", "_row_decay", "_causal_zero",
                          "_weighted_scores")
    header = header.replace("import jax\n", "import functools\n\nimport jax\n", 1)
    return header + tunable_text + f'''
# The decay's exponent per position (read off the reference's positions), over the batch axes it varies along.
RATES = (
    {rates},
)
RATE_SHAPE = {spec.rate_shape!r}
EPS = {spec.eps!r}  # rows are divided by max(sum |row|, EPS)


{walk}


{decay}


{helper_source("agents.offline.attention.helpers", "_block")}


def _sums_kernel(rate_ref, q_ref, k_ref, r_ref, l_ref, *, block, n_q):
    """First pass: each row's absolute sum, then the factor its weighted scores are multiplied by (the decay's
    query factor over the floored sum)."""
    i, j = pl.program_id(1), pl.program_id(2)
    qi, kv = _positions(i, j, n_q)

    @pl.when(_starts(i, j, qi, kv))
    def _init():
        l_ref[...] = jnp.zeros_like(l_ref)

    rate = rate_ref[:, :1]  # (1, 1): this head's decay exponent per position
    last = (qi + 1) * block - 1  # the query block's last position: the decay is factored around it
    s = _weighted_scores(q_ref, k_ref, rate, qi, kv, block, last)
    l_ref[...] += jnp.sum(jnp.abs(s), axis=-1, keepdims=True)

    @pl.when(_ends(i, j, qi, kv))
    def _store():
        row = _row_decay(rate, qi, block, last)  # (block, 1)
        r_ref[...] = row / jnp.maximum(l_ref[...] * row, EPS)


def _output_kernel(rate_ref, q_ref, k_ref, v_ref, r_ref, o_ref, acc_ref, *, block, n_q):
    """Second pass: the normalised scores, rounded as the reference rounds them, times V."""
    i, j = pl.program_id(1), pl.program_id(2)
    qi, kv = _positions(i, j, n_q)

    @pl.when(_starts(i, j, qi, kv))
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    rate = rate_ref[:, :1]
    last = (qi + 1) * block - 1
    p = _weighted_scores(q_ref, k_ref, rate, qi, kv, block, last) * r_ref[...]
    acc_ref[...] += lax.dot_general(p{cast}, v_ref[...], (((1,), (0,)), ((), ())),
                                    preferred_element_type=jnp.float32)

    @pl.when(_ends(i, j, qi, kv))
    def _store():
        o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def computation({args}):
    q, k, v = a{spec.q}, a{spec.k}, a{spec.v}
    *lead, seq, d = q.shape
    dv = v.shape[-1]
    q, k, v = q.reshape(-1, seq, d), k.reshape(-1, seq, d), v.reshape(-1, seq, dv)
    groups = q.shape[0]
    if len(RATE_SHAPE) != len(lead) or any(r not in (1, n) for r, n in zip(RATE_SHAPE, lead)):
        raise ValueError(f"batch axes {{lead}}, but the decay's rates are for {{RATE_SHAPE}}")
    block = _block(seq, BLOCK)
    if seq % block:
        raise ValueError(f"sequence length {{seq}} is not a multiple of 128")
    n_q = seq // block
    rates = jnp.broadcast_to(jnp.asarray(RATES, jnp.float32).reshape(RATE_SHAPE), lead).reshape(groups, 1, 1)
    rates = jnp.broadcast_to(rates, (groups, 1, 128))

    def q_at(i, j):
        return _positions(i, j, n_q)[0]

    def kv_at(i, j):
        return _positions(i, j, n_q)[1]

    grid = (groups, (n_q + 1) // 2, n_q + 1)
    rate_spec = pl.BlockSpec((None, 1, 128), lambda g, i, j: (g, 0, 0))
    q_spec = pl.BlockSpec((None, block, d), lambda g, i, j: (g, q_at(i, j), 0))
    k_spec = pl.BlockSpec((None, block, d), lambda g, i, j: (g, kv_at(i, j), 0))
    r_spec = pl.BlockSpec((None, block, 1), lambda g, i, j: (g, q_at(i, j), 0))
    params = pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                  vmem_limit_bytes=VMEM_LIMIT_BYTES)
    scores_flops = groups * seq * (seq + block) * d  # the causal half plus the diagonal blocks' upper halves
    kv_reads = (n_q + 1) // 2 * q.dtype.itemsize

    row_factor = pl.pallas_call(
        functools.partial(_sums_kernel, block=block, n_q=n_q),
        grid=grid,
        in_specs=[rate_spec, q_spec, k_spec],
        out_specs=r_spec,
        out_shape=jax.ShapeDtypeStruct((groups, seq, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((block, 1), jnp.float32)],
        compiler_params=params,
        cost_estimate=pl.CostEstimate(flops=scores_flops, transcendentals=groups * seq * (n_q + 3),
                                      bytes_accessed=q.size * q.dtype.itemsize + k.size * kv_reads + groups * seq * 4),
    )(rates, q, k)
    out = pl.pallas_call(
        functools.partial(_output_kernel, block=block, n_q=n_q),
        grid=grid,
        in_specs=[rate_spec, q_spec, k_spec, pl.BlockSpec((None, block, dv), lambda g, i, j: (g, kv_at(i, j), 0)),
                  r_spec],
        out_specs=pl.BlockSpec((None, block, dv), lambda g, i, j: (g, q_at(i, j), 0)),
        out_shape=jax.ShapeDtypeStruct((groups, seq, dv), jnp.{spec.out_dtype}),
        scratch_shapes=[pltpu.VMEM((block, dv), jnp.float32)],
        compiler_params=params,
        cost_estimate=pl.CostEstimate(
            flops=scores_flops + groups * seq * (seq + block) * dv, transcendentals=groups * seq * (n_q + 3),
            bytes_accessed=q.size * q.dtype.itemsize + (k.size + v.size) * kv_reads + groups * seq * 4
            + groups * seq * dv * {itemsize(spec.out_dtype)}),
    )(rates, q, k, v, row_factor)
    return out.reshape(*lead, seq, dv)
'''
