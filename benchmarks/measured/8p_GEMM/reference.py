"""Dense bfloat16 matmul C = A @ B with A [8192, 8192] and B [8192, 28672] (f32 accumulation on the MXU), bf16 out."""

import jax
import jax.numpy as jnp

M, K, N = 8192, 8192, 28672


def computation(a, b):
  # a: [M, K] bf16, b: [K, N] bf16 -> [M, N] bf16
  return a @ b


def get_inputs():
  ka, kb = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(ka, (M, K), dtype=jnp.bfloat16)
  b = (jax.random.normal(kb, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  return [a, b], []
