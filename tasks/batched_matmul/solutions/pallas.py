"""Pallas TPU kernel: batched tiled matmul, batch as a leading squeezed grid axis."""

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
}
DEFAULT_BLOCK_M = 512
DEFAULT_BLOCK_N = 512
DEFAULT_BLOCK_K = 512


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


def _bmm_kernel(a_ref, b_ref, o_ref, acc_ref, *, num_k_blocks):
  # a_ref: [block_m, block_k], b_ref: [block_k, block_n] (batch dim squeezed)
  # o_ref: [block_m, block_n], acc_ref: [block_m, block_n] f32 scratch
  k = pl.program_id(3)

  @pl.when(k == 0)
  def _init():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(
      a_ref[...], b_ref[...], preferred_element_type=jnp.float32)  # [block_m, block_n]

  @pl.when(k == num_k_blocks - 1)
  def _store():
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)


def computation(a, b):
  g, m, k = a.shape
  g2, k2, n = b.shape
  assert g == g2 and k == k2, (a.shape, b.shape)
  block_m = _pick_block(m, DEFAULT_BLOCK_M, 16)  # 16: bf16 sublane packing
  block_n = _pick_block(n, DEFAULT_BLOCK_N, 128)
  block_k = _pick_block(k, DEFAULT_BLOCK_K, 128)
  num_k_blocks = k // block_k
  grid = (g, m // block_m, n // block_n, num_k_blocks)

  kernel = functools.partial(_bmm_kernel, num_k_blocks=num_k_blocks)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((g, m, n), a.dtype),
      grid=grid,
      in_specs=[
          pl.BlockSpec((None, block_m, block_k), lambda bi, i, j, kk: (bi, i, kk)),
          pl.BlockSpec((None, block_k, block_n), lambda bi, i, j, kk: (bi, kk, j)),
      ],
      out_specs=pl.BlockSpec((None, block_m, block_n), lambda bi, i, j, kk: (bi, i, j)),
      scratch_shapes=[pltpu.VMEM((block_m, block_n), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      cost_estimate=pl.CostEstimate(
          flops=2 * g * m * n * k,
          transcendentals=0,
          bytes_accessed=a.dtype.itemsize * g * (
              m * k * (n // block_n) + k * n * (m // block_m) + m * n)),
  )(a, b)
