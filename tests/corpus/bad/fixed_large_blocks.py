"""Not a trick: a bf16 matmul tuned with fixed blocks (1024 x 2048, block_k 1024) for its production size,
larger than the task's small test shapes, where its grid would have no steps. It is correct where its blocks
fit, and must be checked there, not called incorrect."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_M, BLOCK_N, BLOCK_K = 1024, 2048, 1024


def computation(a, b):
  m, k = a.shape
  n = b.shape[1]
  return pl.pallas_call(
      functools.partial(_kernel, steps_k=k // BLOCK_K),
      out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
      grid=(m // BLOCK_M, n // BLOCK_N, k // BLOCK_K),
      in_specs=[pl.BlockSpec((BLOCK_M, BLOCK_K), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((BLOCK_K, BLOCK_N), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((BLOCK_M, BLOCK_N), lambda i, j, kk: (i, j)),
      scratch_shapes=[pltpu.VMEM((BLOCK_M, BLOCK_N), jnp.float32)],
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary"),
                                           vmem_limit_bytes=96 * 2**20),
  )(a, b)


def _kernel(a_ref, b_ref, o_ref, acc_ref, *, steps_k):
  @pl.when(pl.program_id(2) == 0)
  def init():
    acc_ref[...] = jnp.zeros_like(acc_ref)

  acc_ref[...] += jnp.dot(a_ref[...], b_ref[...], preferred_element_type=jnp.float32)  # [bm, bn]

  @pl.when(pl.program_id(2) == steps_k - 1)
  def store():
    o_ref[...] = acc_ref[...].astype(o_ref.dtype)
