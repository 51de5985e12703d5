"""Candidate for tasks/causal_gqa_attention: JAX's splash attention TPU kernel, grouped-query, causal.

Wraps jax.experimental.pallas.ops.tpu.splash_attention (make_splash_mha_single_device with a
CausalMask per head: kv blocks above the diagonal are skipped, blocks on it are masked in-kernel) for
q [1, 32, 4096, 128] and k, v [1, 8, 4096, 128] bf16. The batch is folded into the head axis as in
splash_gqa_attention.py; q is scaled by 1/sqrt(head_dim) first (splash does not scale the logits).
"""

import math

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

BLOCK_Q = 512
BLOCK_KV = 1024  # kv rows fetched per grid step
BLOCK_KV_COMPUTE = 512  # kv rows per inner compute step (divides BLOCK_KV)


def computation(q, k, v):
  # q: [batch, q_heads, seq, head_dim], k, v: [batch, kv_heads, seq, head_dim] bf16
  batch, q_heads, seq, head_dim = q.shape
  kv_heads = k.shape[1]
  mask = splash.MultiHeadMask([splash.CausalMask((seq, seq)) for _ in range(batch * q_heads)])
  block_sizes = splash.BlockSizes(
      block_q=min(BLOCK_Q, seq),
      block_kv=min(BLOCK_KV, seq),
      block_kv_compute=min(BLOCK_KV_COMPUTE, seq),
  )
  kernel = splash.make_splash_mha_single_device(mask, block_sizes=block_sizes)
  q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
  out = kernel(
      q.reshape(batch * q_heads, seq, head_dim),
      k.reshape(batch * kv_heads, seq, head_dim),
      v.reshape(batch * kv_heads, seq, head_dim),
  )  # [batch * q_heads, seq, head_dim] bf16
  return out.reshape(batch, q_heads, seq, head_dim)
