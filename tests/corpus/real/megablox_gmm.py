"""Candidate for tasks/grouped_matmul: JAX's megablox grouped matmul (gmm) TPU kernel.

Wraps jax.experimental.pallas.ops.tpu.megablox.gmm for lhs [8192, 4096] bf16, rhs [8, 4096, 14336]
bf16 and int32 group sizes summing to 8192, with MaxText's megablox tiling (tm, tk, tn) =
(512, 1024, 1024), float32 accumulation and a bf16 output. The kernel needs m % tm == 0 (k and n may
be ragged).
"""

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import megablox

TILE_M = 512
TILE_K = 1024
TILE_N = 1024


def computation(lhs, rhs, group_sizes):
  # lhs: [m, k] bf16; rhs: [num_experts, k, n] bf16; group_sizes: [num_experts] int32 -> [m, n] bf16
  return megablox.gmm(lhs, rhs, group_sizes, preferred_element_type=jnp.bfloat16,
                      tiling=(TILE_M, TILE_K, TILE_N))
