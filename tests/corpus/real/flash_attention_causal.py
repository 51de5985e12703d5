"""Candidate for tasks/causal_attention: JAX's flash attention TPU kernel, causal.

Wraps jax.experimental.pallas.ops.tpu.flash_attention.flash_attention (forward only) with block sizes
for q, k, v [4, 16, 2048, 128] bf16: one 512-row q block against 512-row kv blocks per grid step;
blocks above the diagonal are skipped.
"""

import math

from jax.experimental.pallas.ops.tpu import flash_attention as fa

BLOCK_B = 1
BLOCK_Q = 512
BLOCK_K_MAJOR = 512  # kv rows fetched per grid step
BLOCK_K = 512  # kv rows per inner compute step (divides BLOCK_K_MAJOR)


def computation(q, k, v):
  # q, k, v: [batch, heads, seq, head_dim] bf16 -> [batch, heads, seq, head_dim] bf16
  seq, head_dim = q.shape[2], q.shape[3]
  block_sizes = fa.BlockSizes(
      block_q=min(BLOCK_Q, seq),
      block_k_major=min(BLOCK_K_MAJOR, seq),
      block_k=min(BLOCK_K, seq),
      block_b=BLOCK_B,
  )
  return fa.flash_attention(q, k, v, causal=True, sm_scale=1.0 / math.sqrt(head_dim),
                            block_sizes=block_sizes)
