"""KernelBench level 2 "Matmul_Scale_ResidualAdd_Clamp_LogSumExp_Mish", reduced over the features of each row.

y = (x @ W + b) * scale_factor; y = y + y (the residual add of the scaled value to itself);
y = clip(y, clamp_min, clamp_max); l = logsumexp(y, axis=1, keepdims=True); out = l * mish(l).
x [4096, 8192], W [8192, 8192] (in, out), b [8192], all bfloat16; static scale_factor = 2.0, clamp_min = -10.0,
clamp_max = 10.0. Output bf16 [4096, 1].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
SCALE_FACTOR, CLAMP_MIN, CLAMP_MAX = 2.0, -10.0, 10.0


def computation(x, w, b, scale_factor, clamp_min, clamp_max):
  y = (x @ w + b) * scale_factor
  y = y + y
  y = jnp.clip(y, clamp_min, clamp_max)
  lse = jax.nn.logsumexp(y, axis=1, keepdims=True)  # [M, 1]
  return lse * jax.nn.mish(lse)


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], [SCALE_FACTOR, CLAMP_MIN, CLAMP_MAX]
