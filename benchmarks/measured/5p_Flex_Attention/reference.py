"""Causal attention with a learned relative-position bias added to the scores (a FlexAttention score_mod), dense.

q, k, v [4, 64, 4096, 128] (batch, heads, seq, head_dim); bias [64, 4096, 4096], one learned score offset per head
and (query, key) pair, shared by the batch. scores = q k^T / sqrt(head_dim) + bias, causally masked, softmax, @ v.
Static head_dim = 128 (the scale 1/sqrt(head_dim)) and seq_len = 4096 (the causal mask is built for seq_len and
sliced to the inputs' length, which is all of it here). All bfloat16, the softmax too (an f32 one would have cost
the measured program more FLOPs than it had). Output bf16 [4, 64, 4096, 128].
"""

import math

import jax
import jax.numpy as jnp

BATCH, HEADS, SEQ, HEAD_DIM = 4, 64, 4096, 128


def computation(q, k, v, bias, head_dim, seq_len):
  s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(head_dim)
  s = s + bias[None]
  causal = (jnp.arange(seq_len)[:, None] >= jnp.arange(seq_len)[None, :])[:q.shape[2], :k.shape[2]]
  s = jnp.where(causal, s, jnp.finfo(s.dtype).min)
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def get_inputs():
  kq, kk, kv, kb = jax.random.split(jax.random.PRNGKey(0), 4)
  q = jax.random.normal(kq, (BATCH, HEADS, SEQ, HEAD_DIM), dtype=jnp.bfloat16)
  k = jax.random.normal(kk, (BATCH, HEADS, SEQ, HEAD_DIM), dtype=jnp.bfloat16)
  v = jax.random.normal(kv, (BATCH, HEADS, SEQ, HEAD_DIM), dtype=jnp.bfloat16)
  bias = (0.5 * jax.random.normal(kb, (HEADS, SEQ, SEQ), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [q, k, v, bias], [HEAD_DIM, SEQ]
