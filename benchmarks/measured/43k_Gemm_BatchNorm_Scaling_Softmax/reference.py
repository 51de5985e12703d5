"""KernelBench level 2 "Gemm_BatchNorm_Scaling_Softmax": softmax(scale * batch_norm(x @ W + b), axis=1).

BatchNorm1d in inference form: the running mean and variance are inputs, so each feature is normalised as
(h - running_mean) / sqrt(running_var + eps) * gamma + beta (eps 1e-5); batch statistics would have cost the
measured program 20 FLOPs per element more than it had. Then the learned scale (a [1] parameter) and a softmax
over the 8192 features of each row. x [4096, 8192], W [8192, 8192] (in, out), b, gamma, beta, running_mean,
running_var [8192], scale [1], all bfloat16. Output bf16 [4096, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
EPS = 1e-5


def computation(x, w, b, gamma, beta, running_mean, running_var, scale):
  h = x @ w + b  # nn.Linear
  h = (h - running_mean) * jax.lax.rsqrt(running_var + EPS) * gamma + beta
  return jax.nn.softmax(scale * h, axis=1)


def get_inputs():
  kx, kw, kb, kg, kbeta, km, kv = jax.random.split(jax.random.PRNGKey(0), 7)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  gamma = (1.0 + 0.1 * jax.random.normal(kg, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  beta = (0.1 * jax.random.normal(kbeta, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  running_mean = (0.1 * jax.random.normal(km, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  running_var = jax.random.uniform(kv, (N,), dtype=jnp.float32, minval=0.5, maxval=1.5).astype(jnp.bfloat16)
  scale = jnp.ones((1,), dtype=jnp.bfloat16)
  return [x, w, b, gamma, beta, running_mean, running_var, scale], []
