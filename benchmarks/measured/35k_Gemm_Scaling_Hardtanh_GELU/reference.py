"""KernelBench level 2 "Gemm_Scaling_Hardtanh_GELU": gelu(clip((x @ W + b) * scaling_factor, min, max)).

x [4096, 8192], W [8192, 8192] (in, out), b [8192], all bfloat16; static scaling_factor = 0.5 and hardtanh
bounds -2 and 2. GELU is the tanh approximation (jax.nn.gelu's default), which is what the measured program's
FLOP count implies (the erf form costs ~56 more FLOPs per element). Output bf16 [4096, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
SCALING_FACTOR, HARDTANH_MIN, HARDTANH_MAX = 0.5, -2, 2


def computation(x, w, b, scaling_factor, hardtanh_min, hardtanh_max):
  y = (x @ w + b) * scaling_factor
  y = jnp.clip(y, hardtanh_min, hardtanh_max)
  return jax.nn.gelu(y, approximate=True)


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], [SCALING_FACTOR, HARDTANH_MIN, HARDTANH_MAX]
