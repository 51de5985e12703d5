"""KernelBench level 2 "Gemm_Multiply_LeakyReLU": leaky_relu((x @ W + b) * multiplier, negative_slope).

x [4096, 8192], W [8192, 8192] (in, out), b [8192], all bfloat16. The multiplier (2.0) and the negative slope
(0.1) are constants of the module (no static arguments). Output bf16 [4096, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
MULTIPLIER = 2.0
NEGATIVE_SLOPE = 0.1


def computation(x, w, b):
  y = (x @ w + b) * MULTIPLIER  # nn.Linear, then scale
  return jax.nn.leaky_relu(y, negative_slope=NEGATIVE_SLOPE)


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], []
