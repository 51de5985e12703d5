"""Depthwise causal 1-D convolution along the sequence axis (as in Mamba / RetNet blocks), f32.

x [batch=8, seq=4096, channels=2048], w [kernel=4, channels=2048]:
y[b, t, c] = sum_j w[j, c] * x[b, t - j, c], with x[b, t - j, c] = 0 for t - j < 0.
"""

import jax
import jax.numpy as jnp

BATCH, SEQ, CHANNELS, KERNEL = 8, 4096, 2048, 4
TEST_BATCH, TEST_SEQ, TEST_CHANNELS, TEST_KERNEL = 2, 256, 256, 4


def computation(x, w):
  ksize, _ = w.shape
  seq = x.shape[1]
  # Left-pad the sequence axis with ksize - 1 zeros; tap j reads x shifted right by j.
  xp = jnp.pad(x, ((0, 0), (ksize - 1, 0), (0, 0)))
  y = jnp.zeros(x.shape, jnp.float32)
  for j in range(ksize):
    start = ksize - 1 - j
    y = y + w[j].astype(jnp.float32)[None, None, :] * xp[:, start:start + seq, :]
  return y.astype(x.dtype)


def _make_inputs(batch, seq, channels, ksize, dtype, seed):
  kx, kw = jax.random.split(jax.random.PRNGKey(seed), 2)
  x = jax.random.normal(kx, (batch, seq, channels), dtype=jnp.float32)
  w = jax.random.normal(kw, (ksize, channels), dtype=jnp.float32) / jnp.sqrt(jnp.float32(ksize))
  return [x.astype(dtype), w.astype(dtype)], []


def get_inputs(dtype=jnp.float32):
  return _make_inputs(BATCH, SEQ, CHANNELS, KERNEL, dtype, seed=0)


def get_test_inputs(dtype=jnp.float32):
  return _make_inputs(TEST_BATCH, TEST_SEQ, TEST_CHANNELS, TEST_KERNEL, dtype, seed=1)
