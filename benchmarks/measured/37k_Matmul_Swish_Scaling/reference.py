"""KernelBench level 2 "Matmul_Swish_Scaling": y = x @ W + b; y * sigmoid(y) * scaling_factor.

x [4096, 8192], W [8192, 8192] (in, out), b [8192], all bfloat16; scaling_factor (2.0) is a module constant
(no static arguments). Output bf16 [4096, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
SCALING_FACTOR = 2.0


def computation(x, w, b):
  y = x @ w + b  # nn.Linear
  y = y * jax.nn.sigmoid(y)  # Swish
  return y * SCALING_FACTOR


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], []
