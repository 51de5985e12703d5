"""KernelBench level 2 "Conv2d_InstanceNorm_Divide": instance_norm(conv2d(x, W) + b) / divide_by, NCHW.

x [128, 64, 128, 128] (N, C, H, W), W [128, 64, 3, 3] (OIHW), b [128]: a 3x3 convolution, stride 1, no padding
-> [128, 128, 126, 126]. InstanceNorm2d: every (sample, channel) plane normalised over its 126 x 126 values with
their mean and biased variance (eps 1e-5), then an affine weight and bias [128]. Then divided by the static
divide_by = 2.0. All inputs bfloat16; output bf16 [128, 128, 126, 126].
"""

import jax
import jax.numpy as jnp

BATCH, C_IN, C_OUT, H, W, KSIZE = 128, 64, 128, 128, 128, 3
DIVIDE_BY = 2.0
EPS = 1e-5


def computation(x, w, b, norm_weight, norm_bias, divide_by):
  y = jax.lax.conv_general_dilated(x, w, window_strides=(1, 1), padding="VALID",
                                   dimension_numbers=("NCHW", "OIHW", "NCHW"))
  y = y + b[None, :, None, None]
  mean = jnp.mean(y, axis=(2, 3), keepdims=True)
  var = jnp.mean(jnp.square(y - mean), axis=(2, 3), keepdims=True)
  y = (y - mean) * jax.lax.rsqrt(var + EPS)
  y = y * norm_weight[None, :, None, None] + norm_bias[None, :, None, None]
  return y / divide_by


def get_inputs():
  kx, kw, kb, kg, kbeta = jax.random.split(jax.random.PRNGKey(0), 5)
  fan_in = C_IN * KSIZE * KSIZE
  x = jax.random.normal(kx, (BATCH, C_IN, H, W), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (C_OUT, C_IN, KSIZE, KSIZE), dtype=jnp.float32)
       / jnp.sqrt(jnp.float32(fan_in))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  norm_weight = (1.0 + 0.1 * jax.random.normal(kg, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  norm_bias = (0.1 * jax.random.normal(kbeta, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b, norm_weight, norm_bias], [DIVIDE_BY]
