"""KernelBench level 2 "Gemm_GroupNorm_Min_BiasAdd": min over the features of group_norm(x @ W + b), plus a bias.

h = x @ W + b [4096, 8192]; GroupNorm with NUM_GROUPS = 512 groups of 16 consecutive features (per-row, per-group
mean and biased variance, eps 1e-5, affine weight and bias [8192]); m = min over the features, keepdims ->
[4096, 1]; out = m + bias with bias [1, 8192, 1, 1], which broadcasts (as in the PyTorch model) to
[1, 8192, 4096, 1]. The number of groups is no input: 512 is the one whose FLOP count (3 per group and row)
matches the measured program's. The code keeps the group size (16) rather than the count, so that smaller
shapes derived for a correctness check still divide. All inputs bfloat16; output bf16 [1, 8192, 4096, 1].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
NUM_GROUPS = 512
GROUP_SIZE = N // NUM_GROUPS  # 16
EPS = 1e-5


def computation(x, w, b, gn_weight, gn_bias, bias):
  h = x @ w + b  # nn.Linear
  rows, cols = h.shape
  g = h.reshape(rows, cols // GROUP_SIZE, GROUP_SIZE)
  mean = jnp.mean(g, axis=2, keepdims=True)
  var = jnp.mean(jnp.square(g - mean), axis=2, keepdims=True)
  h = ((g - mean) * jax.lax.rsqrt(var + EPS)).reshape(rows, cols) * gn_weight + gn_bias
  m = jnp.min(h, axis=1, keepdims=True)  # [rows, 1]
  return m + bias  # [rows, 1] + [1, cols, 1, 1] -> [1, cols, rows, 1]


def get_inputs():
  kx, kw, kb, kg, kbeta, kbias = jax.random.split(jax.random.PRNGKey(0), 6)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  gn_weight = (1.0 + 0.1 * jax.random.normal(kg, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  gn_bias = (0.1 * jax.random.normal(kbeta, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  bias = jax.random.normal(kbias, (1, N, 1, 1), dtype=jnp.bfloat16)
  return [x, w, b, gn_weight, gn_bias, bias], []
