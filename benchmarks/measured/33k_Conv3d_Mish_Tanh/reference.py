"""KernelBench level 2 "Conv3d_Mish_Tanh": tanh(mish(conv3d(x, W) + b)), NCDHW.

x [16, 32, 32, 64, 64] (N, C, D, H, W), W [64, 32, 3, 3, 3] (OIDHW), b [64]: a 3x3x3 convolution, stride 1, no
padding -> [16, 64, 30, 62, 62]; mish(v) = v * tanh(log(1 + exp(v))), written out as its definition (as the
measured program's FLOP count says it was; jax.nn.mish's stable softplus costs 5 more FLOPs per element); then
tanh. All inputs bfloat16; output bf16.
"""

import jax
import jax.numpy as jnp

BATCH, C_IN, C_OUT, D, H, W, KSIZE = 16, 32, 64, 32, 64, 64, 3


def computation(x, w, b):
  y = jax.lax.conv_general_dilated(x, w, window_strides=(1, 1, 1), padding="VALID",
                                   dimension_numbers=("NCDHW", "OIDHW", "NCDHW"))
  y = y + b[None, :, None, None, None]
  return jnp.tanh(y * jnp.tanh(jnp.log(1.0 + jnp.exp(y))))


def get_inputs():
  kx, kw, kb = jax.random.split(jax.random.PRNGKey(0), 3)
  fan_in = C_IN * KSIZE ** 3
  x = jax.random.normal(kx, (BATCH, C_IN, D, H, W), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (C_OUT, C_IN, KSIZE, KSIZE, KSIZE), dtype=jnp.float32)
       / jnp.sqrt(jnp.float32(fan_in))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b], []
