"""bf16 matmul with f32 accumulation, bf16 output."""

import jax
import jax.numpy as jnp


def computation(a, b):
  # a: [m, k] bf16, b: [k, n] bf16 -> [m, n] bf16
  return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _make_inputs(m, k, n, dtype, seed):
  ka, kb = jax.random.split(jax.random.PRNGKey(seed))
  a = jax.random.normal(ka, (m, k), dtype=jnp.float32).astype(dtype)
  b = jax.random.normal(kb, (k, n), dtype=jnp.float32).astype(dtype)
  return [a, b], []


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(4096, 4096, 4096, dtype, seed=0)


def get_test_inputs(dtype=jnp.bfloat16):
  return _make_inputs(256, 1024, 512, dtype, seed=1)
