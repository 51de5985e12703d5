"""The cross-entropy kernel's source: a grid over (row blocks, vocabulary blocks), the vocabulary last and
'arbitrary'; per block the f32 logits tile (read, or a matmul of the rows' hidden states with a block of the
weight on the MXU), an online row max and sum of exponentials, and the label's logit picked by comparing the
block's column positions with the labels; each row's loss, log(sum) + max - picked, written at its last block.
What the reference does with the losses after (a mean, a sum) stays an XLA op on the [rows] vector."""

from __future__ import annotations

from agents.offline.crossentropy.shape import CrossEntropyParams, CrossEntropyShape

_REDUCE = {"none": "loss", "mean": "jnp.mean(loss)", "sum": "jnp.sum(loss)"}
# Each row's loss from its log-sum-exp, its picked logit and whether its label is in the vocabulary, as the
# reference's way of picking makes it for a label outside.
_WRAP = """
    labels = jnp.where(labels < 0, labels + vocab, labels)  # a gather counts negative labels from the end"""
_LOSS = {("gather", "x"): "jnp.where(hit > 0, lse - p_ref[...], jnp.nan)",
         ("one_hot", "x"): "lse - p_ref[...]",
         ("one_hot", "logp"): "hit * lse - p_ref[...]"}


def cross_entropy_source(spec: CrossEntropyShape, params: CrossEntropyParams, header: str, tunable_text: str) -> str:
    """The kernel module: `header` and `tunable_text` (which carries `params` as the TUNABLE values the code
    reads), the kernel and the wrapper `computation`."""
    del params  # the written module reads its TUNABLE values
    args = ", ".join([f"a{i}" for i in range(spec.n_inputs)] + [f"s{i}" for i in range(spec.n_static)])
    if spec.matmul:
        contract = "(((1,), (1,)), ((), ()))" if spec.weight_transposed else "(((1,), (0,)), ((), ()))"
        tile = f"lax.dot_general(h_ref[...], w_ref[...], {contract}, preferred_element_type=jnp.float32)"
        refs = "h_ref, w_ref"
        w_block = ("pl.BlockSpec((block_vocab, model), lambda i, j: (j, 0))" if spec.weight_transposed
                   else "pl.BlockSpec((model, block_vocab), lambda i, j: (0, j))")
        inputs = f'''    h, w = a{spec.hidden}, a{spec.weight}
    model = h.shape[1]
    vocab = w.shape[{0 if spec.weight_transposed else 1}]
    operands = (h, w)'''
        specs = f'''    in_specs = [pl.BlockSpec((block_rows, model), lambda i, j: (i, 0)), {w_block}]
    flops = 2 * rows * model * vocab
    moved = h.size * h.dtype.itemsize + w.size * w.dtype.itemsize * (rows // block_rows)'''
    else:
        tile = "x_ref[...].astype(jnp.float32)"
        refs = "x_ref"
        inputs = f'''    x = a{spec.logits}
    vocab = x.shape[1]
    operands = (x,)'''
        specs = '''    in_specs = [pl.BlockSpec((block_rows, block_vocab), lambda i, j: (i, j))]
    flops = 5 * rows * vocab
    moved = x.size * x.dtype.itemsize'''
    return header + tunable_text + f'''

def _divisor(size, want, unit):
    """The largest multiple of `unit` up to `want` that divides `size` (all of it when it is shorter)."""
    if size <= want:
        return size
    b = max(unit, want - want % unit)
    while b > unit and size % b:
        b -= unit
    return b


def _kernel(labels_ref, {refs}, loss_ref, m_ref, s_ref, p_ref, hit_ref, *, block_vocab, vocab):
    j = pl.program_id(1)

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        s_ref[...] = jnp.zeros_like(s_ref)
        p_ref[...] = jnp.zeros_like(p_ref)
        hit_ref[...] = jnp.zeros_like(hit_ref)

    x = {tile}  # [block_rows, block_vocab] f32 logits
    cols = j * block_vocab + lax.broadcasted_iota(jnp.int32, (1, block_vocab), 1)
    if vocab % block_vocab:  # the last block runs past the vocabulary
        x = jnp.where(cols < vocab, x, -jnp.inf)
    m_prev = m_ref[...]
    m_new = jnp.maximum(m_prev, jnp.max(x, axis=-1, keepdims=True))
    s_ref[...] = s_ref[...] * jnp.exp(m_prev - m_new) + jnp.sum(jnp.exp(x - m_new), axis=-1, keepdims=True)
    label = cols == labels_ref[...]
    p_ref[...] += jnp.sum(jnp.where(label, x, 0.0), axis=-1, keepdims=True)
    hit_ref[...] += jnp.sum(label.astype(jnp.float32), axis=-1, keepdims=True)
    m_ref[...] = m_new

    @pl.when(j == pl.num_programs(1) - 1)
    def _store():
        lse, hit = jnp.log(s_ref[...]) + m_ref[...], hit_ref[...]
        loss_ref[...] = {_LOSS[(spec.by, spec.picked)]}


def computation({args}):
    labels = a{spec.labels}.reshape(-1, 1).astype(jnp.int32)
    rows = labels.shape[0]
    block_rows = _divisor(rows, BLOCK_ROWS, 8)
    if rows % block_rows:
        raise ValueError(f"{{rows}} rows are not a multiple of 8")
{inputs}{_WRAP if spec.by == "gather" else ""}
    # A ragged vocabulary longer than a block: whole lane tiles, the last block masked in the kernel.
    block_vocab = _divisor(vocab, BLOCK_VOCAB, 128) if vocab % 128 == 0 else min(BLOCK_VOCAB, vocab)
    n_vocab = -(-vocab // block_vocab)
{specs}

    def kernel(*refs):
        return _kernel(*refs, block_vocab=block_vocab, vocab=vocab)

    per_row = pl.BlockSpec((block_rows, 1), lambda i, j: (i, 0))
    loss = pl.pallas_call(
        kernel,
        grid=(rows // block_rows, n_vocab),
        in_specs=[per_row, *in_specs],
        out_specs=per_row,
        out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.float32),
        scratch_shapes=[pltpu.VMEM((block_rows, 1), jnp.float32) for _ in range(4)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
        cost_estimate=pl.CostEstimate(flops=flops, transcendentals=rows * vocab,
                                      bytes_accessed=moved + rows * 8),
    )(labels, *operands)[:, 0]
    return {_REDUCE[spec.reduce]}.astype(jnp.{spec.out_dtype})
'''
