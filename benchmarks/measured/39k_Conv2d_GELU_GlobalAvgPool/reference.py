"""KernelBench level 2 "Conv2d_GELU_GlobalAvgPool": mean over H, W of gelu(conv2d(x, W) + b), NCHW.

x [128, 8, 256, 256] (N, C, H, W), W [64, 8, 3, 3] (OIHW), b [64]: a 3x3 convolution, stride 1, no padding
-> [128, 64, 254, 254]; GELU (the tanh approximation, jax.nn.gelu's default); adaptive average pool to 1 x 1 and
squeeze -> [128, 64]. All inputs bfloat16; output bf16 [128, 64].
"""

import jax
import jax.numpy as jnp

BATCH, C_IN, C_OUT, H, W, KSIZE = 128, 8, 64, 256, 256, 3


def computation(x, w, b):
  y = jax.lax.conv_general_dilated(x, w, window_strides=(1, 1), padding="VALID",
                                   dimension_numbers=("NCHW", "OIHW", "NCHW"))
  y = jax.nn.gelu(y + b[None, :, None, None], approximate=True)
  return jnp.mean(y, axis=(2, 3))


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  fan_in = C_IN * KSIZE * KSIZE
  x = jax.random.normal(kx, (BATCH, C_IN, H, W), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (C_OUT, C_IN, KSIZE, KSIZE), dtype=jnp.float32)
       / jnp.sqrt(jnp.float32(fan_in))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], []
