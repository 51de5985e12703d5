"""Candidate for tasks/matmul_bf16: the matmul from JAX's Pallas TPU guide, with large blocks.

Wraps jax.experimental.pallas.ops.tpu.matmul.matmul for a, b [4096, 4096] bf16 with blocks
bm x bn = 1024 x 2048 and bk = 1024 (f32 accumulator in VMEM, bf16 output). The kernel does not check
divisibility (its grid is floor(dim / block)), so each block is capped at its dimension; every
dimension must be a multiple of its (capped) block.
"""

from jax.experimental.pallas.ops.tpu import matmul as mm

BLOCK_M = 1024
BLOCK_N = 2048
BLOCK_K = 1024


def computation(a, b):
  # a: [m, k] bf16, b: [k, n] bf16 -> [m, n] bf16
  m, k = a.shape
  n = b.shape[1]
  return mm.matmul(a, b, block_shape=(min(BLOCK_M, m), min(BLOCK_N, n)), block_k=min(BLOCK_K, k))
