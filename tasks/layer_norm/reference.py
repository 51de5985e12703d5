"""Layer normalisation over the last dimension with affine gamma/beta."""

import jax
import jax.numpy as jnp

EPS = 1e-5


def computation(x, gamma, beta, eps):
  # x: [rows, hidden], gamma/beta: [hidden], eps: static Python float
  mean = jnp.mean(x, axis=-1, keepdims=True)
  xc = x - mean
  var = jnp.mean(xc * xc, axis=-1, keepdims=True)
  y = xc * jax.lax.rsqrt(var + eps)
  return y * gamma[None, :] + beta[None, :]


def _make_inputs(rows, hidden, dtype, seed):
  kx, kg, kb = jax.random.split(jax.random.PRNGKey(seed), 3)
  x = jax.random.normal(kx, (rows, hidden), dtype=dtype)
  gamma = (1.0 + 0.1 * jax.random.normal(kg, (hidden,), dtype=jnp.float32)).astype(dtype)
  beta = (0.1 * jax.random.normal(kb, (hidden,), dtype=jnp.float32)).astype(dtype)
  return [x, gamma, beta], [EPS]


def get_inputs(dtype=jnp.float32):
  return _make_inputs(8192, 4096, dtype, seed=0)


def get_test_inputs(dtype=jnp.float32):
  return _make_inputs(128, 512, dtype, seed=1)
