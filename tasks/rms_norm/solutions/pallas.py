"""Pallas TPU kernel: RMS norm of bf16 rows, computed in f32, output bf16."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "TARGET_BLOCK_BYTES_F32": (2097152, 4194304, 8388608, 16777216, 33554432),
    "MAX_BLOCK_ROWS": (128, 256, 512, 1024, 2048),
    "VMEM_LIMIT_BYTES": (33554432, 67108864, 104857600),
}
# Budget is in f32 bytes since the block is upcast inside the kernel.
TARGET_BLOCK_BYTES_F32 = 8 * 1024 * 1024
MIN_BLOCK_ROWS = 16  # bf16 packs 16 rows per vreg tile
MAX_BLOCK_ROWS = 1024
VMEM_LIMIT_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  block_rows: int

  @classmethod
  def get_default(cls, rows: int, hidden: int) -> "BlockSizes":
    block_rows = MAX_BLOCK_ROWS
    while block_rows > MIN_BLOCK_ROWS and block_rows * hidden * 4 > TARGET_BLOCK_BYTES_F32:
      block_rows //= 2
    block_rows = min(block_rows, rows)
    if rows % block_rows:
      raise ValueError(f"rows={rows} not divisible by block_rows={block_rows}")
    return cls(block_rows=block_rows)


def computation(x, weight, eps):
  rows, hidden = x.shape
  block_sizes = BlockSizes.get_default(rows, hidden)
  return _rms_norm(x, weight.reshape(1, hidden), eps=float(eps), block_sizes=block_sizes)


@functools.partial(jax.jit, static_argnames=["eps", "block_sizes"])
def _rms_norm(x, weight2d, *, eps: float, block_sizes: BlockSizes):
  rows, hidden = x.shape
  bm = block_sizes.block_rows
  kernel = functools.partial(_rms_norm_kernel, eps=eps)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(rows // bm,),
      in_specs=[
          pl.BlockSpec((bm, hidden), lambda i: (i, 0)),  # x
          pl.BlockSpec((1, hidden), lambda i: (0, 0)),  # weight
      ],
      out_specs=pl.BlockSpec((bm, hidden), lambda i: (i, 0)),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel",),
          vmem_limit_bytes=VMEM_LIMIT_BYTES,
      ),
      cost_estimate=pl.CostEstimate(
          flops=4 * rows * hidden,
          transcendentals=rows,
          bytes_accessed=2 * x.size * x.dtype.itemsize + hidden * weight2d.dtype.itemsize,
      ),
  )(x, weight2d)


def _rms_norm_kernel(x_ref, weight_ref, o_ref, *, eps: float):
  x = x_ref[...].astype(jnp.float32)  # [block_rows, hidden]
  ms = jnp.mean(x * x, axis=-1, keepdims=True)  # [block_rows, 1]
  w = weight_ref[...].astype(jnp.float32)  # [1, hidden]
  o_ref[...] = (x * jax.lax.rsqrt(ms + eps) * w).astype(o_ref.dtype)
