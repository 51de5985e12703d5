"""Pallas TPU kernel: layer norm over the last dimension with affine gamma/beta."""

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
# Target bytes of one f32 row block; each block holds full rows.
TARGET_BLOCK_BYTES = 4 * 1024 * 1024
MIN_BLOCK_ROWS = 8
MAX_BLOCK_ROWS = 512
VMEM_LIMIT_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  block_rows: int

  @classmethod
  def get_default(cls, rows: int, hidden: int) -> "BlockSizes":
    block_rows = MAX_BLOCK_ROWS
    while block_rows > MIN_BLOCK_ROWS and block_rows * hidden * 4 > TARGET_BLOCK_BYTES:
      block_rows //= 2
    block_rows = min(block_rows, rows)
    if rows % block_rows:
      raise ValueError(f"rows={rows} not divisible by block_rows={block_rows}")
    return cls(block_rows=block_rows)


def computation(x, gamma, beta, eps):
  rows, hidden = x.shape
  block_sizes = BlockSizes.get_default(rows, hidden)
  return _layer_norm(
      x, gamma.reshape(1, hidden), beta.reshape(1, hidden),
      eps=float(eps), block_sizes=block_sizes)


@functools.partial(jax.jit, static_argnames=["eps", "block_sizes"])
def _layer_norm(x, gamma2d, beta2d, *, eps: float, block_sizes: BlockSizes):
  rows, hidden = x.shape
  bm = block_sizes.block_rows
  kernel = functools.partial(_layer_norm_kernel, eps=eps)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
      grid=(rows // bm,),
      in_specs=[
          pl.BlockSpec((bm, hidden), lambda i: (i, 0)),  # x
          pl.BlockSpec((1, hidden), lambda i: (0, 0)),  # gamma
          pl.BlockSpec((1, hidden), lambda i: (0, 0)),  # beta
      ],
      out_specs=pl.BlockSpec((bm, hidden), lambda i: (i, 0)),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel",),
          vmem_limit_bytes=VMEM_LIMIT_BYTES,
      ),
      cost_estimate=pl.CostEstimate(
          flops=8 * rows * hidden,
          transcendentals=rows,
          bytes_accessed=2 * x.size * x.dtype.itemsize + 2 * hidden * gamma2d.dtype.itemsize,
      ),
  )(x, gamma2d, beta2d)


def _layer_norm_kernel(x_ref, gamma_ref, beta_ref, o_ref, *, eps: float):
  x = x_ref[...].astype(jnp.float32)  # [block_rows, hidden]
  mean = jnp.mean(x, axis=-1, keepdims=True)  # [block_rows, 1]
  xc = x - mean  # [block_rows, hidden]
  var = jnp.mean(xc * xc, axis=-1, keepdims=True)  # [block_rows, 1]
  y = xc * jax.lax.rsqrt(var + eps)  # [block_rows, hidden]
  gamma = gamma_ref[...].astype(jnp.float32)  # [1, hidden]
  beta = beta_ref[...].astype(jnp.float32)  # [1, hidden]
  o_ref[...] = (y * gamma + beta).astype(o_ref.dtype)
