"""Pallas TPU kernel: blocked bf16 matmul with an f32 VMEM accumulator."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "DEFAULT_BLOCK_M": (128, 256, 512, 1024, 2048),
    "DEFAULT_BLOCK_N": (128, 256, 512, 1024, 2048),
    "DEFAULT_BLOCK_K": (128, 256, 512, 1024, 2048),
    "VMEM_LIMIT_BYTES": (33554432, 67108864, 104857600),
}
DEFAULT_BLOCK_M = 1024
DEFAULT_BLOCK_N = 1024
DEFAULT_BLOCK_K = 512
VMEM_LIMIT_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  block_m: int
  block_n: int
  block_k: int

  @classmethod
  def get_default(cls, m: int, k: int, n: int) -> "BlockSizes":
    bm = min(DEFAULT_BLOCK_M, m)
    bn = min(DEFAULT_BLOCK_N, n)
    bk = min(DEFAULT_BLOCK_K, k)
    if m % bm or n % bn or k % bk:
      raise ValueError(f"shape (m={m}, k={k}, n={n}) not divisible by blocks {(bm, bk, bn)}")
    return cls(block_m=bm, block_n=bn, block_k=bk)


def computation(a, b):
  m, k = a.shape
  k2, n = b.shape
  if k != k2:
    raise ValueError(f"contracting dims differ: {a.shape} @ {b.shape}")
  return _matmul(a, b, block_sizes=BlockSizes.get_default(m, k, n))


@functools.partial(jax.jit, static_argnames=["block_sizes"])
def _matmul(a, b, *, block_sizes: BlockSizes):
  m, k = a.shape
  _, n = b.shape
  bm, bn, bk = block_sizes.block_m, block_sizes.block_n, block_sizes.block_k
  grid = (m // bm, n // bn, k // bk)
  return pl.pallas_call(
      _matmul_kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
      grid=grid,
      in_specs=[
          pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),  # a
          pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)),  # b
      ],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "arbitrary"),
          vmem_limit_bytes=VMEM_LIMIT_BYTES,
      ),
      cost_estimate=pl.CostEstimate(
          flops=2 * m * n * k,
          transcendentals=0,
          bytes_accessed=(m * k * (n // bn) + k * n * (m // bm)) * a.dtype.itemsize
          + m * n * a.dtype.itemsize,
      ),
  )(a, b)


def _matmul_kernel(a_ref, b_ref, o_ref, acc_ref):
  # a_ref: [block_m, block_k], b_ref: [block_k, block_n]
  # o_ref: [block_m, block_n], acc_ref: [block_m, block_n] f32
  k_idx = pl.program_id(2)

  @pl.when(k_idx == 0)
  def _init():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)

  @pl.when(k_idx == pl.num_programs(2) - 1)
  def _store():
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)
