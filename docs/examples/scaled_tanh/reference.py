"""Soft capping, as attention logits use it: y = scale * tanh(x / scale), elementwise over an f32 matrix."""

import jax
import jax.numpy as jnp

SCALE = 30.0


def computation(x, scale):
  # x: [rows, cols] float32 (dynamic); scale: a Python float (static)
  return scale * jnp.tanh(x / scale)


def _make_inputs(rows, cols, seed):
  x = 50.0 * jax.random.normal(jax.random.PRNGKey(seed), (rows, cols), dtype=jnp.float32)
  return [x], [SCALE]


def get_inputs():
  """The production shapes: what is compiled and timed."""
  return _make_inputs(4096, 4096, seed=0)


def get_test_inputs():
  """Small shapes for the correctness check (Pallas interpret mode on a host without a TPU)."""
  return _make_inputs(64, 512, seed=1)
