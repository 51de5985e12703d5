"""RMS normalisation of bf16 activations, computed in f32, output bf16."""

import jax
import jax.numpy as jnp

EPS = 1e-6


def computation(x, weight, eps):
  # x: [rows, hidden] bf16, weight: [hidden] bf16, eps: static Python float
  x32 = x.astype(jnp.float32)
  ms = jnp.mean(x32 * x32, axis=-1, keepdims=True)
  y = x32 * jax.lax.rsqrt(ms + eps) * weight.astype(jnp.float32)[None, :]
  return y.astype(x.dtype)


def _make_inputs(rows, hidden, dtype, seed):
  kx, kw = jax.random.split(jax.random.PRNGKey(seed))
  x = jax.random.normal(kx, (rows, hidden), dtype=jnp.float32).astype(dtype)
  weight = (1.0 + 0.1 * jax.random.normal(kw, (hidden,), dtype=jnp.float32)).astype(dtype)
  return [x, weight], [EPS]


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(16384, 4096, dtype, seed=0)


def get_test_inputs(dtype=jnp.bfloat16):
  return _make_inputs(128, 512, dtype, seed=1)
