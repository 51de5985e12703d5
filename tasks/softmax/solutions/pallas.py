"""Pallas TPU kernel: numerically stable row softmax over the last dimension."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "TARGET_BLOCK_BYTES": (1048576, 2097152, 4194304, 8388608, 16777216),
    "MAX_BLOCK_ROWS": (64, 128, 256, 512, 1024),
    "VMEM_LIMIT_BYTES": (33554432, 67108864, 104857600),
}
# Target bytes of one f32 input block; the full row is held in VMEM.
TARGET_BLOCK_BYTES = 4 * 1024 * 1024
MIN_BLOCK_ROWS = 8
MAX_BLOCK_ROWS = 512
VMEM_LIMIT_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  block_rows: int

  @classmethod
  def get_default(cls, rows: int, cols: int) -> "BlockSizes":
    block_rows = MAX_BLOCK_ROWS
    while block_rows > MIN_BLOCK_ROWS and block_rows * cols * 4 > TARGET_BLOCK_BYTES:
      block_rows //= 2
    block_rows = min(block_rows, rows)
    if rows % block_rows:
      raise ValueError(f"rows={rows} not divisible by block_rows={block_rows}")
    return cls(block_rows=block_rows)


def computation(x):
  rows, cols = x.shape
  return _softmax(x, block_sizes=BlockSizes.get_default(rows, cols))


@functools.partial(jax.jit, static_argnames=["block_sizes"])
def _softmax(x, *, block_sizes: BlockSizes):
  rows, cols = x.shape
  bm = block_sizes.block_rows
  return pl.pallas_call(
      _softmax_kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(rows // bm,),
      in_specs=[pl.BlockSpec((bm, cols), lambda i: (i, 0))],
      out_specs=pl.BlockSpec((bm, cols), lambda i: (i, 0)),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel",),
          vmem_limit_bytes=VMEM_LIMIT_BYTES,
      ),
      cost_estimate=pl.CostEstimate(
          flops=4 * rows * cols,
          transcendentals=rows * cols,
          bytes_accessed=2 * x.size * x.dtype.itemsize,
      ),
  )(x)


def _softmax_kernel(x_ref, o_ref):
  x = x_ref[...].astype(jnp.float32)  # [block_rows, cols]
  m = jnp.max(x, axis=-1, keepdims=True)  # [block_rows, 1]
  e = jnp.exp(x - m)  # [block_rows, cols]
  s = jnp.sum(e, axis=-1, keepdims=True)  # [block_rows, 1]
  o_ref[...] = (e / s).astype(o_ref.dtype)
