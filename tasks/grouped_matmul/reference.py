"""Grouped matmul of an MoE layer's expert up-projection, bfloat16 in/out, float32 accumulation.

The rows of lhs are tokens sorted by expert: rows [offset[e], offset[e] + group_sizes[e]) go through
expert e, out[i] = lhs[i] @ rhs[e], where offset[e] = sum(group_sizes[:e]) and the group sizes sum to
m. Mixtral-8x7B-like: 4096 tokens routed top-2 (m = 8192 rows) over 8 experts, hidden 4096, ffn 14336.
"""

import jax
import jax.numpy as jnp

NUM_EXPERTS, M, K, N = 8, 8192, 4096, 14336


def computation(lhs, rhs, group_sizes):
  # lhs: [m, k] bf16; rhs: [num_experts, k, n] bf16; group_sizes: [num_experts] int32, summing to m
  out = jax.lax.ragged_dot(lhs, rhs, group_sizes, preferred_element_type=jnp.float32)  # [m, n]
  return out.astype(lhs.dtype)


def _make_inputs(num_experts, m, k, n, dtype, seed):
  kl, kr, kg = jax.random.split(jax.random.PRNGKey(seed), 3)
  lhs = jax.random.normal(kl, (m, k), dtype=jnp.float32)
  rhs = jax.random.normal(kr, (num_experts, k, n), dtype=jnp.float32) / jnp.sqrt(jnp.float32(k))
  # An uneven routing: num_experts - 1 random cut points in [0, m] (empty groups are allowed).
  cuts = jnp.sort(jax.random.randint(kg, (num_experts - 1,), 0, m + 1, dtype=jnp.int32))
  bounds = jnp.concatenate([jnp.zeros((1,), jnp.int32), cuts, jnp.full((1,), m, jnp.int32)])
  group_sizes = jnp.diff(bounds).astype(jnp.int32)  # [num_experts], sums to m
  return [lhs.astype(dtype), rhs.astype(dtype), group_sizes], []


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(NUM_EXPERTS, M, K, N, dtype, seed=0)


def get_test_inputs(dtype=jnp.bfloat16):
  """Small enough for interpret mode; the group sizes still add up to m."""
  return _make_inputs(4, 1024, 1024, 1024, dtype, seed=1)
