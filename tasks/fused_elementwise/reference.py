"""Fused elementwise epilogue: y = clip(gelu_tanh(x * 1.5 + bias), -3, 3) + x."""

import jax
import jax.numpy as jnp

SCALE = 1.5
CLIP_MIN = -3.0
CLIP_MAX = 3.0


def computation(x, bias):
  # x: [rows, hidden], bias: [hidden]
  h = x * SCALE + bias[None, :]
  g = jax.nn.gelu(h, approximate=True)
  return jnp.clip(g, CLIP_MIN, CLIP_MAX) + x


def _make_inputs(rows, hidden, dtype, seed):
  kx, kb = jax.random.split(jax.random.PRNGKey(seed))
  x = jax.random.normal(kx, (rows, hidden), dtype=dtype)
  bias = (0.1 * jax.random.normal(kb, (hidden,), dtype=jnp.float32)).astype(dtype)
  return [x, bias], []


def get_inputs(dtype=jnp.float32):
  return _make_inputs(8192, 4096, dtype, seed=0)


def get_test_inputs(dtype=jnp.float32):
  return _make_inputs(256, 512, dtype, seed=1)
