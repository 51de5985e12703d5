"""Matmul followed by a row softmax, f32.

y = softmax(x @ w, axis=-1) with x [4096, 2048], w [2048, 4096]: each of the 4096 rows is
normalised over its 4096 output columns. The matmul is computed at full f32 precision
(Precision.HIGHEST) so the result does not depend on the backend's default f32 matmul precision.
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 2048, 4096
TEST_M, TEST_K, TEST_N = 512, 1024, 1024


def computation(x, w):
  logits = jnp.dot(x, w, precision=jax.lax.Precision.HIGHEST,
                   preferred_element_type=jnp.float32)
  return jax.nn.softmax(logits, axis=-1).astype(x.dtype)


def _make_inputs(m, k, n, dtype, seed):
  kx, kw = jax.random.split(jax.random.PRNGKey(seed), 2)
  x = jax.random.normal(kx, (m, k), dtype=jnp.float32)
  # Logits of a few units, like attention scores or a classifier head.
  w = 2.0 * jax.random.normal(kw, (k, n), dtype=jnp.float32) / jnp.sqrt(jnp.float32(k))
  return [x.astype(dtype), w.astype(dtype)], []


def get_inputs(dtype=jnp.float32):
  return _make_inputs(M, K, N, dtype, seed=0)


def get_test_inputs(dtype=jnp.float32):
  return _make_inputs(TEST_M, TEST_K, TEST_N, dtype, seed=1)
