"""Multi-head causal scaled-dot-product attention, bfloat16 in/out, softmax in float32.

out[b, h] = softmax(q[b, h] @ k[b, h]^T / sqrt(head_dim) + causal_mask) @ v[b, h]
with q, k, v [batch=4, heads=16, seq=2048, head_dim=128]; query i attends to keys j <= i.
"""

import math

import jax
import jax.numpy as jnp

BATCH, HEADS, SEQ, HEAD_DIM = 4, 16, 2048, 128
TEST_BATCH, TEST_HEADS, TEST_SEQ, TEST_HEAD_DIM = 1, 2, 1024, 128


def computation(q, k, v):
  seq, head_dim = q.shape[-2], q.shape[-1]
  scale = 1.0 / math.sqrt(head_dim)
  s = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
  causal = jnp.arange(seq)[:, None] >= jnp.arange(seq)[None, :]  # [q, k]
  s = jnp.where(causal[None, None], s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)  # f32
  out = jnp.einsum("bhqk,bhkd->bhqd", p, v.astype(jnp.float32))
  return out.astype(q.dtype)


def _make_inputs(b, h, s, d, dtype, seed):
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(seed), 3)
  q = jax.random.normal(kq, (b, h, s, d), dtype=jnp.float32)
  k = jax.random.normal(kk, (b, h, s, d), dtype=jnp.float32)
  v = jax.random.normal(kv, (b, h, s, d), dtype=jnp.float32)
  return [q.astype(dtype), k.astype(dtype), v.astype(dtype)], []


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(BATCH, HEADS, SEQ, HEAD_DIM, dtype, seed=0)


def get_test_inputs(dtype=jnp.bfloat16):
  return _make_inputs(TEST_BATCH, TEST_HEADS, TEST_SEQ, TEST_HEAD_DIM, dtype, seed=1)
