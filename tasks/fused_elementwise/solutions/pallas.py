"""Pallas TPU kernel: y = clip(gelu_tanh(x * 1.5 + bias), -3, 3) + x."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

SCALE = 1.5
CLIP_MIN = -3.0
CLIP_MAX = 3.0

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "DEFAULT_BLOCK_ROWS": (64, 128, 256, 512, 1024),
    "DEFAULT_BLOCK_COLS": (512, 1024, 2048, 4096),
    "VMEM_LIMIT_BYTES": (33554432, 67108864, 104857600),
}
DEFAULT_BLOCK_ROWS = 512
DEFAULT_BLOCK_COLS = 2048
VMEM_LIMIT_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  block_rows: int
  block_cols: int

  @classmethod
  def get_default(cls, rows: int, cols: int) -> "BlockSizes":
    block_rows = min(DEFAULT_BLOCK_ROWS, rows)
    block_cols = min(DEFAULT_BLOCK_COLS, cols)
    if rows % block_rows or cols % block_cols:
      raise ValueError(
          f"shape {(rows, cols)} not divisible by blocks {(block_rows, block_cols)}")
    return cls(block_rows=block_rows, block_cols=block_cols)


def computation(x, bias):
  rows, cols = x.shape
  block_sizes = BlockSizes.get_default(rows, cols)
  return _fused_elementwise(x, bias.reshape(1, cols), block_sizes=block_sizes)


@functools.partial(jax.jit, static_argnames=["block_sizes"])
def _fused_elementwise(x, bias2d, *, block_sizes: BlockSizes):
  rows, cols = x.shape
  bm, bn = block_sizes.block_rows, block_sizes.block_cols
  grid = (rows // bm, cols // bn)
  return pl.pallas_call(
      _fused_elementwise_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=grid,
      in_specs=[
          pl.BlockSpec((bm, bn), lambda i, j: (i, j)),  # x
          pl.BlockSpec((1, bn), lambda i, j: (0, j)),  # bias
      ],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel"),
          vmem_limit_bytes=VMEM_LIMIT_BYTES,
      ),
      cost_estimate=pl.CostEstimate(
          flops=12 * rows * cols,
          transcendentals=rows * cols,
          bytes_accessed=2 * x.size * x.dtype.itemsize + bias2d.size * bias2d.dtype.itemsize,
      ),
  )(x, bias2d)


def _fused_elementwise_kernel(x_ref, bias_ref, o_ref):
  x = x_ref[...].astype(jnp.float32)  # [block_rows, block_cols]
  bias = bias_ref[...].astype(jnp.float32)  # [1, block_cols]
  h = x * SCALE + bias  # [block_rows, block_cols]
  g = jax.nn.gelu(h, approximate=True)  # tanh form: 0.5 * h * (1 + tanh(...))
  o_ref[...] = (jnp.clip(g, CLIP_MIN, CLIP_MAX) + x).astype(o_ref.dtype)
