"""Pallas TPU kernel: tiled matmul with the bias + GELU epilogue fused into the store."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "DEFAULT_BLOCK_M": (128, 256, 512, 1024),
    "DEFAULT_BLOCK_N": (128, 256, 512, 1024),
    "DEFAULT_BLOCK_K": (128, 256, 512, 1024),
    "VMEM_LIMIT_BYTES": (33554432, 50331648, 67108864, 104857600),
}
DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_N = 512
DEFAULT_BLOCK_K = 512
VMEM_LIMIT_BYTES = 48 * 1024 * 1024


def _pick_block(dim, preferred, align):
  """Largest multiple of `align` that divides `dim` and is <= `preferred` (else `dim`)."""
  if dim <= preferred:
    return dim
  block = preferred - preferred % align
  while block >= align:
    if dim % block == 0:
      return block
    block -= align
  return dim


def _matmul_bias_gelu_kernel(x_ref, w_ref, b_ref, o_ref, acc_ref, *, num_k_blocks):
  # x_ref: [block_m, block_k], w_ref: [block_k, block_n], b_ref: [1, block_n]
  # o_ref: [block_m, block_n], acc_ref: [block_m, block_n] f32 scratch
  k = pl.program_id(2)

  @pl.when(k == 0)
  def _init():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(
      x_ref[...], w_ref[...],
      precision=jax.lax.Precision.HIGHEST,
      preferred_element_type=jnp.float32)  # [block_m, block_n]

  @pl.when(k == num_k_blocks - 1)
  def _store():
    y = acc_ref[...] + b_ref[...].astype(jnp.float32)  # [block_m, block_n]
    o_ref[...] = jax.nn.gelu(y, approximate=True).astype(o_ref.dtype)


def computation(x, w, b):
  m, k = x.shape
  k2, n = w.shape
  assert k == k2 and b.shape == (n,), (x.shape, w.shape, b.shape)
  block_m = _pick_block(m, DEFAULT_BLOCK_M, 8)
  block_n = _pick_block(n, DEFAULT_BLOCK_N, 128)
  block_k = _pick_block(k, DEFAULT_BLOCK_K, 128)
  num_k_blocks = k // block_k
  grid = (m // block_m, n // block_n, num_k_blocks)

  b2 = b.reshape(1, n)
  kernel = functools.partial(_matmul_bias_gelu_kernel, num_k_blocks=num_k_blocks)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
      grid=grid,
      in_specs=[
          pl.BlockSpec((block_m, block_k), lambda i, j, kk: (i, kk)),
          pl.BlockSpec((block_k, block_n), lambda i, j, kk: (kk, j)),
          pl.BlockSpec((1, block_n), lambda i, j, kk: (0, j)),
      ],
      out_specs=pl.BlockSpec((block_m, block_n), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary"),
          vmem_limit_bytes=VMEM_LIMIT_BYTES),
      cost_estimate=pl.CostEstimate(
          flops=2 * m * n * k,
          transcendentals=m * n,
          bytes_accessed=x.dtype.itemsize * (m * k * (n // block_n) + k * n * (m // block_m) + m * n + n)),
  )(x, w, b2)
