"""Matmul + bias + GELU (tanh approximation), f32.

y = gelu(x @ w + b, approximate=True) with x [8192, 4096], w [4096, 4096], b [4096].
The matmul is computed at full f32 precision (Precision.HIGHEST) so the result does not
depend on the backend's default f32 matmul precision.
"""

import jax
import jax.numpy as jnp

M, K, N = 8192, 4096, 4096
TEST_M, TEST_K, TEST_N = 1024, 1024, 1024


def computation(x, w, b):
  y = jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST,
              preferred_element_type=jnp.float32)
  y = y + b.astype(jnp.float32)[None, :]
  return jax.nn.gelu(y, approximate=True).astype(x.dtype)


def _make_inputs(m, k, n, dtype, seed):
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jax.random.normal(kx, (m, k), dtype=jnp.float32)
  # Scale so that x @ w has unit variance, as with a standard weight init.
  w = jax.random.normal(kw, (k, n), dtype=jnp.float32) / jnp.sqrt(jnp.float32(k))
  b = 0.1 * jax.random.normal(kb, (n,), dtype=jnp.float32)
  return [x.astype(dtype), w.astype(dtype), b.astype(dtype)], []


def get_inputs(dtype=jnp.float32):
  return _make_inputs(M, K, N, dtype, seed=0)


def get_test_inputs(dtype=jnp.float32):
  return _make_inputs(TEST_M, TEST_K, TEST_N, dtype, seed=1)
