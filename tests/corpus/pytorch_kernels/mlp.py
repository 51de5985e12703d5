"""Pallas TPU kernel for a ported MLP block, Linear -> ReLU -> Linear: both matmuls fused in one kernel.

computation(x, up_bias, up_weight, down_bias, down_weight) with PyTorch's layouts: x [M, H], up_weight [F, H],
down_weight [H, F] (rows are output features, so both matmuls contract the weights' last axis). The grid runs
over blocks of rows; both weights stay in VMEM (their index maps are constant, so they are fetched once), and the
hidden activation [block_m, F] never leaves VMEM.
"""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner may vary these (agents.tunable); the values below are the defaults.
TUNABLE = {"BLOCK_M": (64, 128, 256), "VMEM_LIMIT_BYTES": (32 * 2**20, 64 * 2**20)}
BLOCK_M = 128
VMEM_LIMIT_BYTES = 32 * 2**20


def computation(x, up_bias, up_weight, down_bias, down_weight):
    m, hidden = x.shape
    ffn = up_weight.shape[0]
    if up_weight.shape != (ffn, hidden) or down_weight.shape != (hidden, ffn):
        raise ValueError(f"weights do not fit x {x.shape}: {up_weight.shape=} {down_weight.shape=}")
    block_m = min(BLOCK_M, m)
    if m % block_m or block_m % 8:
        raise ValueError(f"rows {m=} must be a multiple of {block_m=}, itself a multiple of 8")
    # VMEM: x and out blocks [block_m, H] and both weights (F x H each), double-buffered, plus the
    # [block_m, F] f32 hidden activation.
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((m, hidden), x.dtype),
        grid=(m // block_m,),
        in_specs=[pl.BlockSpec((block_m, hidden), lambda i: (i, 0)),
                  pl.BlockSpec((1, ffn), lambda i: (0, 0)),
                  pl.BlockSpec((ffn, hidden), lambda i: (0, 0)),
                  pl.BlockSpec((1, hidden), lambda i: (0, 0)),
                  pl.BlockSpec((hidden, ffn), lambda i: (0, 0))],
        out_specs=pl.BlockSpec((block_m, hidden), lambda i: (i, 0)),
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel",),
                                             vmem_limit_bytes=VMEM_LIMIT_BYTES),
    )(x, up_bias.reshape(1, ffn), up_weight, down_bias.reshape(1, hidden), down_weight)


def _kernel(x_ref, b1_ref, w1_ref, b2_ref, w2_ref, o_ref):
    # x_ref, o_ref: [block_m, H]; w1_ref: [F, H]; w2_ref: [H, F]; b1_ref: [1, F]; b2_ref: [1, H]
    contract_last = (((1,), (1,)), ((), ()))
    h = jax.lax.dot_general(x_ref[...], w1_ref[...], contract_last, preferred_element_type=jnp.float32)
    h = jnp.maximum(h + b1_ref[...].astype(jnp.float32), 0.0)  # [block_m, F]
    out = jax.lax.dot_general(h.astype(w2_ref.dtype), w2_ref[...], contract_last,
                              preferred_element_type=jnp.float32)  # [block_m, H]
    o_ref[...] = (out + b2_ref[...].astype(jnp.float32)).astype(o_ref.dtype)
