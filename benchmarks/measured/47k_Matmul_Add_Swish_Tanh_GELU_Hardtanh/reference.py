"""KernelBench level 2 "Matmul_Add_Swish_Tanh_GELU_Hardtanh": hardtanh(gelu(tanh(swish(x @ W + b + add_value)))).

x [4096, 8192], W [8192, 8192] (in, out), b [8192] and the learned add_value [8192], all bfloat16. swish(v) = v *
sigmoid(v); GELU is the tanh approximation (jax.nn.gelu's default); hardtanh clips to [-1, 1]. Output bf16
[4096, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192


def computation(x, w, b, add_value):
  y = x @ w + b  # nn.Linear
  y = y + add_value
  y = y * jax.nn.sigmoid(y)
  y = jnp.tanh(y)
  y = jax.nn.gelu(y, approximate=True)
  return jnp.clip(y, -1.0, 1.0)


def get_inputs():
  kx, kw, kb, ka = jax.random.split(jax.random.PRNGKey(0), 4)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  add_value = (0.02 * jax.random.normal(ka, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b, add_value], []
