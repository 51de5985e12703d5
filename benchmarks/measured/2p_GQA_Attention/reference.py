"""Grouped-query causal attention as a production model writes it: the 8 KV heads repeated to the 128 query heads.

q [4, 4096, 128, 128] (batch, seq, heads, head_dim), k, v [4, 4096, 8, 128]: query head h uses KV head h // 16.
The KV heads are materialised repeated (jnp.repeat) and attention is computed densely over every query head:
softmax(q k^T / sqrt(head_dim) with a causal mask) v, the masked half of the scores computed and discarded.
All bfloat16, the softmax too (as the measured program's FLOP count implies). Output bf16 [4, 4096, 128, 128].
"""

import math

import jax
import jax.numpy as jnp

BATCH, SEQ, Q_HEADS, KV_HEADS, HEAD_DIM = 4, 4096, 128, 8, 128


def computation(q, k, v):
  seq, q_heads, head_dim = q.shape[1], q.shape[2], q.shape[3]
  group = q_heads // k.shape[2]
  k = jnp.repeat(k, group, axis=2)  # [b, s, q_heads, d]
  v = jnp.repeat(v, group, axis=2)
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(head_dim)
  causal = jnp.tril(jnp.ones((seq, seq), dtype=jnp.bool_))
  s = jnp.where(causal, s, jnp.finfo(s.dtype).min)
  p = jax.nn.softmax(s, axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def get_inputs():
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(kq, (BATCH, SEQ, Q_HEADS, HEAD_DIM), dtype=jnp.bfloat16)
  k = jax.random.normal(kk, (BATCH, SEQ, KV_HEADS, HEAD_DIM), dtype=jnp.bfloat16)
  v = jax.random.normal(kv, (BATCH, SEQ, KV_HEADS, HEAD_DIM), dtype=jnp.bfloat16)
  return [q, k, v], []
