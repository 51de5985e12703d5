"""The grouped matmul's source: the schedule of (group, row tile) visits made from the group sizes, then one
pallas_call that walks it with the schedule prefetched as scalars."""

from __future__ import annotations

from agents.offline.grouped.shape import GroupedParams, GroupedShape


def grouped_source(spec: GroupedShape, params: GroupedParams, header: str, tunable_text: str) -> str:
    """The kernel module: `header` and `tunable_text` (which carries `params` as the TUNABLE values the code
    reads), the schedule, the kernel and the wrapper `computation`."""
    del params  # the written module reads its TUNABLE values
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    if spec.transposed:
        w_block = "pl.BlockSpec((None, bn, bk), lambda j, v, kk, *s: (jnp.minimum(s[0][v], groups - 1), j, kk))"
        contract = "(((1,), (1,)), ((), ()))"
    else:
        w_block = "pl.BlockSpec((None, bk, bn), lambda j, v, kk, *s: (jnp.minimum(s[0][v], groups - 1), kk, j))"
        contract = "(((1,), (0,)), ((), ()))"
    header = header.replace("import jax\n", "import functools\nimport math\n\nimport jax\n", 1)
    return header + tunable_text + f'''

def _schedule(sizes, m, block_m, visits):
    """For each visit, in row order: its group, its row tile, whether it is one of the groups' visits (1) or a
    repeat of the last (0); and each group's first and end row. A group visits every tile its rows touch; an
    empty group visits none. The rows past the groups' total (ragged_dot gives them zeros) are one more group,
    whose visits store zeros."""
    ends = jnp.minimum(jnp.cumsum(sizes.astype(jnp.int32)), m)
    ends = jnp.concatenate([ends, jnp.full((1,), m, jnp.int32)])
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    sizes = ends - starts
    first = starts // block_m
    count = jnp.where(sizes > 0, (ends - 1) // block_m - first + 1, 0)
    done = jnp.cumsum(count)
    v = jnp.arange(visits, dtype=jnp.int32)
    total = done[-1]
    at = jnp.minimum(v, jnp.maximum(total - 1, 0))
    group = jnp.minimum(jnp.searchsorted(done, at, side="right"), sizes.shape[0] - 1).astype(jnp.int32)
    tile = (first[group] + at - (done[group] - count[group])).astype(jnp.int32)
    return group, tile, (v < total).astype(jnp.int32), starts, ends


def _kernel(group_ref, tile_ref, real_ref, start_ref, end_ref, x_ref, w_ref, o_ref, acc_ref, *, groups):
    v, kk = pl.program_id(1), pl.program_id(2)

    @pl.when(kk == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when((real_ref[v] == 1) & (group_ref[v] < groups))  # the last group's rows (no weights) stay zero
    def _product():
        acc_ref[...] += lax.dot_general(x_ref[...], w_ref[...], {contract},
                                        preferred_element_type=jnp.float32)

    @pl.when((kk == pl.num_programs(2) - 1) & (real_ref[v] == 1))
    def _store():  # this group's rows of the tile; the tile's other rows are its other visits'
        g = group_ref[v]
        rows = tile_ref[v] * o_ref.shape[0] + lax.broadcasted_iota(jnp.int32, o_ref.shape, 0)
        mine = (rows >= start_ref[g]) & (rows < end_ref[g])
        o_ref[...] = jnp.where(mine, acc_ref[...].astype(o_ref.dtype), o_ref[...])


def computation({args}):
    x = a{spec.lhs}.astype(jnp.{spec.dtype})
    w = a{spec.rhs}.astype(jnp.{spec.rhs_dtype})
    m, k = x.shape
    n = w.shape[{1 if spec.transposed else 2}]
    # Blocks that divide what they tile at any shape the module is called with: rows by their gcd (m is a
    # multiple of 8), the lane-tiled n and k whole where the chosen block does not divide them.
    bm = math.gcd(min(BLOCK_M, m), m)
    bn, bk = (b if size % b == 0 else size for b, size in ((min(BLOCK_N, n), n), (min(BLOCK_K, k), k)))
    groups = w.shape[0]
    visits = m // bm + groups  # a tile per group boundary beyond the dense walk's tiles (groups + 1 groups)
    schedule = _schedule(a{spec.sizes}, m, bm, visits)
    return pl.pallas_call(
        functools.partial(_kernel, groups=groups),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=5,
            grid=(n // bn, visits, k // bk),
            in_specs=[pl.BlockSpec((bm, bk), lambda j, v, kk, *s: (s[1][v], kk)),
                      {w_block}],
            out_specs=pl.BlockSpec((bm, bn), lambda j, v, kk, *s: (s[1][v], j)),
            scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        ),
        out_shape=jax.ShapeDtypeStruct((m, n), jnp.{spec.out_dtype}),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(flops=2 * m * k * n, transcendentals=0,
                                      bytes_accessed=(m * k * (n // bn) + groups * k * n) * x.dtype.itemsize
                                      + m * n * jnp.dtype(jnp.{spec.out_dtype}).itemsize),
    )(*schedule, x, w)
'''
