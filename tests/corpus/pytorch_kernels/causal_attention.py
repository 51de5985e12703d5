"""Pallas TPU kernel for a ported causal attention (F.scaled_dot_product_attention(is_causal=True), or the same
written out with a torch.tril mask): flash attention over q, k, v of shape [batch, heads, seq, head_dim].

Grid (batch, heads, q blocks, kv blocks), the kv axis last and "arbitrary": the running row max, row sum and
output accumulator stay in f32 VMEM across kv steps. A kv block wholly above the causal diagonal is skipped,
and its index map repeats the last block the q block needs, so the pipeline does not fetch it either.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner may vary these (agents.tunable); the values below are the defaults.
TUNABLE = {"BLOCK_Q": (128, 256, 512), "BLOCK_KV": (128, 256, 512)}
BLOCK_Q = 128
BLOCK_KV = 128


def computation(q, k, v):
    batch, heads, seq, head_dim = q.shape
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k and v must have one shape: {q.shape=} {k.shape=} {v.shape=}")
    block_q, block_kv = min(BLOCK_Q, seq), min(BLOCK_KV, seq)
    if seq % block_q or seq % block_kv or block_q % 8 or block_kv % 128 and block_kv != seq:
        raise ValueError(f"{seq=} must be a multiple of {block_q=} (of 8) and {block_kv=} (of 128)")
    kv_blocks = seq // block_kv

    def q_map(b, h, i, j):
        return (b, h, i, 0)

    def kv_map(b, h, i, j):
        return (b, h, jnp.minimum(j, _last_kv_block(i, block_q, block_kv)), 0)

    kernel = functools.partial(_kernel, scale=1.0 / math.sqrt(head_dim), block_q=block_q, block_kv=block_kv,
                               kv_blocks=kv_blocks)
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        grid=(batch, heads, seq // block_q, kv_blocks),
        in_specs=[pl.BlockSpec((None, None, block_q, head_dim), q_map),
                  pl.BlockSpec((None, None, block_kv, head_dim), kv_map),
                  pl.BlockSpec((None, None, block_kv, head_dim), kv_map)],
        out_specs=pl.BlockSpec((None, None, block_q, head_dim), q_map),
        scratch_shapes=[pltpu.VMEM((block_q, 1), jnp.float32),  # running row max
                        pltpu.VMEM((block_q, 1), jnp.float32),  # running row sum
                        pltpu.VMEM((block_q, head_dim), jnp.float32)],  # output accumulator
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
    )(q, k, v)


def _last_kv_block(i, block_q, block_kv):
    """The last kv block q block i attends to (lax.div: non-negative operands, no sign logic in the kernel)."""
    return jax.lax.div(i * block_q + block_q - 1, block_kv)


def _kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *, scale, block_q, block_kv, kv_blocks):
    # q_ref, o_ref: [block_q, head_dim]; k_ref, v_ref: [block_kv, head_dim]
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def init():
        m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)

    @pl.when(j <= _last_kv_block(i, block_q, block_kv))
    def compute():
        s = jax.lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale  # [block_q, block_kv]
        rows = i * block_q + jax.lax.broadcasted_iota(jnp.int32, s.shape, 0)
        cols = j * block_kv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        s = jnp.where(cols <= rows, s, -jnp.inf)
        m_prev = m_ref[...]  # [block_q, 1]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))  # finite: column 0 is never masked
        alpha = jnp.exp(m_prev - m_new)
        p = jnp.exp(s - m_new)  # [block_q, block_kv]
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
        acc_ref[...] = alpha * acc_ref[...] + jnp.dot(p.astype(v_ref.dtype), v_ref[...],
                                                      preferred_element_type=jnp.float32)
        m_ref[...] = m_new

    @pl.when(j == kv_blocks - 1)
    def store():
        o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)
