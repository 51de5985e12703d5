"""Inclusive prefix sum along the last axis, f32: y = jnp.cumsum(x, axis=-1), x [4096, 8192].

A scan-like task: cumsum has no direct Mosaic (Pallas TPU) lowering, so a kernel has to build
the scan from supported ops (e.g. a blocked triangular matmul plus a running carry).
"""

import jax
import jax.numpy as jnp

ROWS, COLS = 4096, 8192
TEST_ROWS, TEST_COLS = 256, 1024


def computation(x):
  return jnp.cumsum(x, axis=-1)


def _make_inputs(rows, cols, dtype, seed):
  x = jax.random.normal(jax.random.PRNGKey(seed), (rows, cols), dtype=jnp.float32)
  return [x.astype(dtype)], []


def get_inputs(dtype=jnp.float32):
  return _make_inputs(ROWS, COLS, dtype, seed=0)


def get_test_inputs(dtype=jnp.float32):
  return _make_inputs(TEST_ROWS, TEST_COLS, dtype, seed=1)
