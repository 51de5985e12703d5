"""KernelBench level 2 "Gemm_GroupNorm_Swish_Multiply_Swish": swish(swish(group_norm(x @ W + b)) * multiply_weight).

h = x @ W + b [4096, 8192]; GroupNorm with num_groups = 256 groups of 32 consecutive features over num_channels =
8192 (per-row, per-group mean and biased variance, eps 1e-5, affine weight and bias [8192]); swish(v) = v *
sigmoid(v); times the learned multiply_weight [8192]; swish again. x [4096, 8192], W [8192, 8192] (in, out), b,
gn_weight, gn_bias, multiply_weight [8192], all bfloat16; static num_groups = 256, num_channels = 8192. The code
takes the group size from them (num_channels // num_groups = 32) and the channel count from h, so that smaller
shapes derived for a correctness check (with the same static values) still work. Output bf16 [4096, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
NUM_GROUPS, NUM_CHANNELS = 256, 8192
EPS = 1e-5


def computation(x, w, b, gn_weight, gn_bias, multiply_weight, num_groups, num_channels):
  h = x @ w + b  # nn.Linear
  rows, cols = h.shape
  group_size = num_channels // num_groups
  g = h.reshape(rows, cols // group_size, group_size)
  mean = jnp.mean(g, axis=2, keepdims=True)
  var = jnp.mean(jnp.square(g - mean), axis=2, keepdims=True)
  h = ((g - mean) * jax.lax.rsqrt(var + EPS)).reshape(rows, cols) * gn_weight + gn_bias
  h = h * jax.nn.sigmoid(h)
  h = h * multiply_weight
  return h * jax.nn.sigmoid(h)


def get_inputs():
  kx, kw, kb, kg, kbeta, kmul = jax.random.split(jax.random.PRNGKey(0), 6)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  gn_weight = (1.0 + 0.1 * jax.random.normal(kg, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  gn_bias = (0.1 * jax.random.normal(kbeta, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  multiply_weight = jax.random.normal(kmul, (N,), dtype=jnp.bfloat16)
  return [x, w, b, gn_weight, gn_bias, multiply_weight], [NUM_GROUPS, NUM_CHANNELS]
