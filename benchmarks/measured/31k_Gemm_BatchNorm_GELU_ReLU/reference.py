"""KernelBench level 2 "Gemm_BatchNorm_GELU_ReLU": relu(gelu(batch_norm(x @ W + b))) with batch statistics.

BatchNorm1d as in training mode (the model's default): each of the 8192 features is normalised with the mean and
biased variance over the 16384 rows of the batch (eps 1e-5), then scaled and shifted by gamma and beta (no running
statistics are inputs, and the FLOP count agrees). GELU is the tanh approximation (jax.nn.gelu's default).
x [16384, 8192], W [8192, 8192] (in, out), b, gamma, beta [8192], all bfloat16. Output bf16 [16384, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 16384, 8192, 8192
EPS = 1e-5


def computation(x, w, b, gamma, beta):
  h = x @ w + b  # nn.Linear
  mean = jnp.mean(h, axis=0, keepdims=True)
  var = jnp.mean(jnp.square(h - mean), axis=0, keepdims=True)
  h = (h - mean) * jax.lax.rsqrt(var + EPS) * gamma + beta
  return jax.nn.relu(jax.nn.gelu(h, approximate=True))


def get_inputs():
  kx, kw, kb, kg, kbeta = jax.random.split(jax.random.PRNGKey(0), 5)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  gamma = (1.0 + 0.1 * jax.random.normal(kg, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  beta = (0.1 * jax.random.normal(kbeta, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b, gamma, beta], []
