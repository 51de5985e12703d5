"""Batched matmul in bfloat16 with float32 accumulation.

c[g] = a[g] @ b[g] for g in range(32), a and b [32, 1024, 1024] bf16, output bf16.
"""

import jax
import jax.numpy as jnp

BATCH, M, K, N = 32, 1024, 1024, 1024
TEST_BATCH, TEST_M, TEST_K, TEST_N = 2, 512, 1024, 1024


def computation(a, b):
  c = jnp.einsum("gmk,gkn->gmn", a, b, preferred_element_type=jnp.float32)
  return c.astype(a.dtype)


def _make_inputs(g, m, k, n, dtype, seed):
  ka, kb = jax.random.split(jax.random.PRNGKey(seed), 2)
  a = jax.random.normal(ka, (g, m, k), dtype=jnp.float32)
  b = jax.random.normal(kb, (g, k, n), dtype=jnp.float32) / jnp.sqrt(jnp.float32(k))
  return [a.astype(dtype), b.astype(dtype)], []


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(BATCH, M, K, N, dtype, seed=0)


def get_test_inputs(dtype=jnp.bfloat16):
  return _make_inputs(TEST_BATCH, TEST_M, TEST_K, TEST_N, dtype, seed=1)
