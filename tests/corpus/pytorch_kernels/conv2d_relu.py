"""Pallas TPU kernel for a ported 3x3 convolution (stride 1, padding 1, with bias) followed by ReLU.

computation(x, conv_bias, conv_weight) with PyTorch's layouts: x [N, C_in, H, W], conv_weight [C_out, C_in, 3, 3].
The wrapper moves channels last (they become the lanes) and pads the image once; the kernel takes one padded
image per grid step and sums the nine taps as [H*W, C_in] @ [C_in, C_out] matmuls into an f32 accumulator, then
adds the bias and applies ReLU. The output comes back to NCHW in the wrapper.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def computation(x, conv_bias, conv_weight):
    n, c_in, height, width = x.shape
    c_out, c_in_w, kh, kw = conv_weight.shape
    if c_in_w != c_in or (kh, kw) != (3, 3) or conv_bias.shape != (c_out,):
        raise ValueError(f"a 3x3 convolution of {x.shape=} needs conv_weight [C_out, {c_in}, 3, 3] and "
                         f"conv_bias [C_out]: {conv_weight.shape=} {conv_bias.shape=}")
    if width % 8:
        raise ValueError(f"{width=} must be a multiple of 8 (the rows of a tap's [H*W, C_in] matrix)")
    padded = jnp.pad(jnp.transpose(x, (0, 2, 3, 1)), ((0, 0), (1, 1), (1, 1), (0, 0)))  # [N, H+2, W+2, C_in]
    taps = jnp.transpose(conv_weight, (2, 3, 1, 0)).reshape(9, c_in, c_out)  # [tap, C_in, C_out]
    out = pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((n, height * width, c_out), x.dtype),
        grid=(n,),
        in_specs=[pl.BlockSpec((None, height + 2, width + 2, c_in), lambda b: (b, 0, 0, 0)),
                  pl.BlockSpec((9, c_in, c_out), lambda b: (0, 0, 0)),
                  pl.BlockSpec((1, c_out), lambda b: (0, 0))],
        out_specs=pl.BlockSpec((None, height * width, c_out), lambda b: (b, 0, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",)),
    )(padded, taps, conv_bias.reshape(1, c_out))
    return jnp.transpose(out.reshape(n, height, width, c_out), (0, 3, 1, 2))


def _kernel(x_ref, w_ref, b_ref, o_ref):
    # x_ref: [H+2, W+2, C_in] (one padded image); w_ref: [9, C_in, C_out]; b_ref: [1, C_out]; o_ref: [H*W, C_out]
    height, width = x_ref.shape[0] - 2, x_ref.shape[1] - 2
    acc = jnp.zeros(o_ref.shape, jnp.float32)
    for dy in range(3):
        for dx in range(3):
            patch = x_ref[dy:dy + height, dx:dx + width, :]  # [H, W, C_in]
            acc += jnp.dot(patch.reshape(height * width, -1), w_ref[3 * dy + dx],
                           preferred_element_type=jnp.float32)
    o_ref[...] = jnp.maximum(acc + b_ref[...].astype(jnp.float32), 0.0).astype(o_ref.dtype)
