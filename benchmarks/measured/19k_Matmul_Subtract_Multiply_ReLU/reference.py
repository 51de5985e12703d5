"""KernelBench level 2 "Matmul_Subtract_Multiply_ReLU": relu((x @ W + b - subtract_value) * multiply_value).

x [4096, 8192], W [8192, 8192] (in, out), b [8192], all bfloat16; subtract_value = 2.0 and multiply_value = 1.5
are static Python floats. Output bf16 [4096, 8192].
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
SUBTRACT_VALUE, MULTIPLY_VALUE = 2.0, 1.5


def computation(x, w, b, subtract_value, multiply_value):
  y = x @ w + b  # nn.Linear
  y = (y - subtract_value) * multiply_value
  return jax.nn.relu(y)


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], [SUBTRACT_VALUE, MULTIPLY_VALUE]
