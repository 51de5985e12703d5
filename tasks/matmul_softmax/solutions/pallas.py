"""Pallas TPU kernel: row-blocked matmul with the row softmax fused into the store.

Each output block spans all N columns so that the softmax of a row can be computed once the
K reduction for that row block is finished; K is the last ("arbitrary") grid axis.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "DEFAULT_BLOCK_M": (64, 128, 256, 512),
    "DEFAULT_BLOCK_K": (128, 256, 512, 1024),
    "VMEM_LIMIT_BYTES": (50331648, 83886080, 104857600),
}
DEFAULT_BLOCK_M = 256
DEFAULT_BLOCK_K = 512
VMEM_LIMIT_BYTES = 80 * 1024 * 1024


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


def _matmul_softmax_kernel(x_ref, w_ref, o_ref, acc_ref, *, num_k_blocks):
  # x_ref: [block_m, block_k], w_ref: [block_k, n]
  # o_ref: [block_m, n], acc_ref: [block_m, n] f32 scratch
  k = pl.program_id(1)

  @pl.when(k == 0)
  def _init():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(
      x_ref[...], w_ref[...],
      precision=jax.lax.Precision.HIGHEST,
      preferred_element_type=jnp.float32)  # [block_m, n]

  @pl.when(k == num_k_blocks - 1)
  def _store():
    logits = acc_ref[...]  # [block_m, n]
    row_max = jnp.max(logits, axis=-1, keepdims=True)  # [block_m, 1]
    e = jnp.exp(logits - row_max)  # [block_m, n]
    denom = jnp.sum(e, axis=-1, keepdims=True)  # [block_m, 1]
    o_ref[...] = (e * (1.0 / denom)).astype(o_ref.dtype)


def computation(x, w):
  m, k = x.shape
  k2, n = w.shape
  assert k == k2, (x.shape, w.shape)
  block_m = _pick_block(m, DEFAULT_BLOCK_M, 8)
  block_k = _pick_block(k, DEFAULT_BLOCK_K, 128)
  num_k_blocks = k // block_k
  grid = (m // block_m, num_k_blocks)

  kernel = functools.partial(_matmul_softmax_kernel, num_k_blocks=num_k_blocks)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
      grid=grid,
      in_specs=[
          pl.BlockSpec((block_m, block_k), lambda i, kk: (i, kk)),
          pl.BlockSpec((block_k, n), lambda i, kk: (kk, 0)),
      ],
      out_specs=pl.BlockSpec((block_m, n), lambda i, kk: (i, 0)),
      scratch_shapes=[pltpu.VMEM((block_m, n), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary"),
          vmem_limit_bytes=VMEM_LIMIT_BYTES),
      cost_estimate=pl.CostEstimate(
          flops=2 * m * n * k,
          transcendentals=m * n,
          bytes_accessed=x.dtype.itemsize * (m * k + k * n * (m // block_m) + m * n)),
  )(x, w)
