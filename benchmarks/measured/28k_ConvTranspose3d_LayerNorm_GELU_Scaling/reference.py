"""KernelBench level 2 "ConvTranspose3d_LayerNorm_GELU_Scaling": gelu(layer_norm(conv_transpose3d(x, W) + b)) * s.

x [32, 32, 16, 32, 32] (N, C, D, H, W); W [32, 64, 4, 4, 4] in PyTorch's ConvTranspose3d layout (in, out, kD, kH,
kW); b [64]. Static: stride = 2, padding = 1, kernel_size = 4, eps = 1e-5, scaling_factor = 1.0. The transposed
convolution gives (16 - 1) * 2 - 2 * 1 + 4 = 32 and 64 -> [32, 64, 32, 64, 64].

It is written as the measured program evidently wrote it: the input is dilated explicitly (zeros scattered
between the samples, [32, 32, 31, 63, 63]) and a dense stride-1 convolution with the spatially flipped,
in/out-swapped kernel, padded by kernel_size - 1 - padding, runs over it, multiplying the inserted zeros too.
That is what the CSV's FLOP count is (1.005e12; a conv_general_dilated with lhs_dilation, which XLA decomposes
into the stride phases, is 1.29e11): the same math with ~7.8x the MXU work, which is the program XLA was timed on.

LayerNorm(out_channels) acts, as nn.LayerNorm does on a 5-D tensor, on the last axis (the output width, 64 =
out_channels) with an affine weight and bias [64]; GELU is the tanh approximation (jax.nn.gelu's default).
All inputs bfloat16; output bf16 [32, 64, 32, 64, 64].
"""

import jax
import jax.numpy as jnp

BATCH, C_IN, C_OUT, D, H, W, KSIZE = 32, 32, 64, 16, 32, 32, 4
STRIDE, PADDING, EPS, SCALING_FACTOR = 2, 1, 1e-05, 1.0


def computation(x, w, b, ln_weight, ln_bias, stride, padding, kernel_size, eps, scaling_factor):
  assert w.shape[2:] == (kernel_size,) * 3, (w.shape, kernel_size)
  n, c, d, h, wd = x.shape
  dilated = jnp.zeros((n, c, (d - 1) * stride + 1, (h - 1) * stride + 1, (wd - 1) * stride + 1), x.dtype)
  dilated = dilated.at[:, :, ::stride, ::stride, ::stride].set(x)
  rhs = jnp.flip(w, axis=(2, 3, 4)).transpose(1, 0, 2, 3, 4)  # [out, in, kD, kH, kW]
  pad = kernel_size - 1 - padding
  y = jax.lax.conv_general_dilated(dilated, rhs, window_strides=(1, 1, 1), padding=[(pad, pad)] * 3,
                                   dimension_numbers=("NCDHW", "OIDHW", "NCDHW"))
  y = y + b[None, :, None, None, None]
  mean = jnp.mean(y, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(y - mean), axis=-1, keepdims=True)
  y = (y - mean) * jax.lax.rsqrt(var + eps) * ln_weight + ln_bias
  return jax.nn.gelu(y, approximate=True) * scaling_factor


def get_inputs():
  kx, kw, kb, kg, kbeta = jax.random.split(jax.random.PRNGKey(0), 5)
  fan_in = C_IN * KSIZE ** 3 // STRIDE ** 3  # taps that land on real (not dilation) input per output
  x = jax.random.normal(kx, (BATCH, C_IN, D, H, W), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (C_IN, C_OUT, KSIZE, KSIZE, KSIZE), dtype=jnp.float32)
       / jnp.sqrt(jnp.float32(fan_in))).astype(jnp.bfloat16)
  b = (0.1 * jax.random.normal(kb, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  ln_weight = (1.0 + 0.1 * jax.random.normal(kg, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  ln_bias = (0.1 * jax.random.normal(kbeta, (C_OUT,), dtype=jnp.float32)).astype(jnp.bfloat16)
  return [x, w, b, ln_weight, ln_bias], [STRIDE, PADDING, KSIZE, EPS, SCALING_FACTOR]
