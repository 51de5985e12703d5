"""Causal grouped-query attention (a long-context prefill), bfloat16 in/out, softmax in float32.

q [batch=1, q_heads=32, seq=4096, head_dim=128], k, v [1, kv_heads=8, 4096, 128], Llama-3-8B-like:
query head h uses kv head h // 4, query i attends to keys j <= i, scale 1/sqrt(head_dim).
"""

import math

import jax
import jax.numpy as jnp

BATCH, Q_HEADS, KV_HEADS, SEQ, HEAD_DIM = 1, 32, 8, 4096, 128


def computation(q, k, v):
  # q: [batch, q_heads, seq, head_dim], k, v: [batch, kv_heads, seq, head_dim] bf16
  batch, q_heads, seq, head_dim = q.shape
  kv_heads = k.shape[1]
  group = q_heads // kv_heads
  scale = 1.0 / math.sqrt(head_dim)
  qg = q.reshape(batch, kv_heads, group, seq, head_dim)
  s = jnp.einsum("bhgqd,bhkd->bhgqk", qg, k, preferred_element_type=jnp.float32) * scale
  causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]  # [q, k]
  s = jnp.where(causal, s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)  # f32
  out = jnp.einsum("bhgqk,bhkd->bhgqd", p, v.astype(jnp.float32))
  return out.reshape(batch, q_heads, seq, head_dim).astype(q.dtype)


def _make_inputs(b, hq, hkv, s, d, dtype, seed):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(kq, (b, hq, s, d), dtype=jnp.float32)
  k = jax.random.normal(kk, (b, hkv, s, d), dtype=jnp.float32)
  v = jax.random.normal(kv, (b, hkv, s, d), dtype=jnp.float32)
  return [q.astype(dtype), k.astype(dtype), v.astype(dtype)], []


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(BATCH, Q_HEADS, KV_HEADS, SEQ, HEAD_DIM, dtype, seed=0)
