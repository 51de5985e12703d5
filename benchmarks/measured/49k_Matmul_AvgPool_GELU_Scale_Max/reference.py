"""KernelBench level 2 "Matmul_AvgPool_GELU_Scale_Max": max over features of scale * gelu(avg_pool_16(x @ W + b)).

h = x @ W + b [4096, 8192]; a 1-D average pool over the features with kernel (and stride) pool_kernel_size = 16
-> [4096, 512], a window sum in the input's dtype divided by 16, as AvgPool1d does (jnp.mean would upcast to
f32); GELU (the tanh approximation, jax.nn.gelu's default); times scale_factor = 2.0; max over the 512 pooled
features -> [4096]. x [4096, 8192], W [8192, 8192] (in, out), b [8192], all bfloat16; static
pool_kernel_size = 16 and scale_factor = 2.0. Output bf16 [4096].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
POOL_KERNEL_SIZE, SCALE_FACTOR = 16, 2.0


def computation(x, w, b, pool_kernel_size, scale_factor):
  h = x @ w + b  # nn.Linear
  window = (1, pool_kernel_size)
  h = jax.lax.reduce_window(h, 0.0, jax.lax.add, window, window, "VALID") / pool_kernel_size  # AvgPool1d
  h = jax.nn.gelu(h, approximate=True) * scale_factor
  return jnp.max(h, axis=1)


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], [POOL_KERNEL_SIZE, SCALE_FACTOR]
