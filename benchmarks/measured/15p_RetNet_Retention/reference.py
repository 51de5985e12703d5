"""RetNet's parallel retention: (decay mask * q k^T) normalised per row, times v.

q, k, v [4, 16, 4096, 256] (batch, heads, seq, head_dim) bfloat16. Head h decays with gamma_h = 1 - 2^(-5 - h);
the mask D[h, n, m] = exp(log(gamma_h) * (n - m)) for m <= n and 0 above the diagonal, built from an integer
distance. The scores q k^T are computed in f32 (preferred_element_type), multiplied by D, each row divided by
max(sum_m |row|, 1); the result is cast to bf16 and multiplied by v. Output bf16 [4, 16, 4096, 256].
"""

import jax
import jax.numpy as jnp

BATCH, HEADS, SEQ, HEAD_DIM = 4, 16, 4096, 256


def computation(q, k, v):
  heads, seq = q.shape[1], q.shape[2]
  log_gamma = jnp.log(1.0 - 2.0 ** (-5.0 - jnp.arange(heads, dtype=jnp.float32)))  # [heads]
  n = jnp.arange(seq)
  distance = n[:, None] - n[None, :]  # [seq, seq] int32
  decay = jnp.where(distance >= 0, jnp.exp(log_gamma[:, None, None] * distance.astype(jnp.float32)), 0.0)
  s = jnp.einsum("bhnd,bhmd->bhnm", q, k, preferred_element_type=jnp.float32)
  s = s * decay[None]
  s = s / jnp.maximum(jnp.sum(jnp.abs(s), axis=-1, keepdims=True), 1.0)
  return jnp.einsum("bhnm,bhmd->bhnd", s.astype(v.dtype), v)


def get_inputs():
  kq, kk, kv = jax.random.split(jax.random.PRNGKey(0), 3)
  q = jax.random.normal(kq, (BATCH, HEADS, SEQ, HEAD_DIM), dtype=jnp.bfloat16)
  k = jax.random.normal(kk, (BATCH, HEADS, SEQ, HEAD_DIM), dtype=jnp.bfloat16)
  v = jax.random.normal(kv, (BATCH, HEADS, SEQ, HEAD_DIM), dtype=jnp.bfloat16)
  return [q, k, v], []
