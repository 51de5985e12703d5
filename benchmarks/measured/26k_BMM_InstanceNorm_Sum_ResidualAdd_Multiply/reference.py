"""KernelBench level 2 "BMM_InstanceNorm_Sum_ResidualAdd_Multiply": h = x @ W + b; instance-normalise h; (h + y) * y.

The KernelBench model views each row of h [4096, 8192] as a one-channel 1 x 8192 image, so its InstanceNorm2d
normalises every row over its 8192 features with that row's own mean and biased variance (eps 1e-5); here with
an affine weight and bias of 8192 values each (the two extra [8192] inputs). Then the residual sum with y and
the product with y. x, y [4096, 8192], W [8192, 8192] (in, out), b, weight, bias [8192], all bfloat16.
Output bf16 [4096, 8192].

This is the one workload not written as the measured program was. Its FLOP count (3 per element fewer than
here, exactly) is that of an instance norm over a [4096, 8192, 1, 1] view: each feature a channel of its own,
normalised over a 1 x 1 extent, so h - mean(h) = 0 and the norm's output is its bias whatever x and W are. That
degenerate form would let a kernel skip the matmul altogether, so the KernelBench semantics (a per-row norm) is
kept; the measured time is of the degenerate program (the same matmul with a purely elementwise epilogue).
"""

import jax
import jax.numpy as jnp

M, K, N = 4096, 8192, 8192
EPS = 1e-5


def computation(x, y, w, b, norm_weight, norm_bias):
  h = x @ w + b  # nn.Linear ("bmm")
  mean = jnp.mean(h, axis=1, keepdims=True)
  var = jnp.mean(jnp.square(h - mean), axis=1, keepdims=True)
  h = (h - mean) * jax.lax.rsqrt(var + EPS) * norm_weight + norm_bias
  h = h + y
  return h * y


def get_inputs():
  kx, ky, kw, kb, kg, kbeta = jax.random.split(jax.random.PRNGKey(0), 6)
  x = jax.random.normal(kx, (M, K), dtype=jnp.bfloat16)
  y = jax.random.normal(ky, (M, N), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (K, N), dtype=jnp.float32) / jnp.sqrt(jnp.float32(K))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  weight = (1.0 + 0.1 * jax.random.normal(kg, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  bias = (0.1 * jax.random.normal(kbeta, (N,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, y, w, b, weight, bias], []
