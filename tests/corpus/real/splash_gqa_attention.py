"""Candidate for tasks/gqa_attention: JAX's splash attention TPU kernel, grouped-query, full mask.

Wraps jax.experimental.pallas.ops.tpu.splash_attention (make_splash_mha_single_device, which serves
query head h from kv head h // (q_heads / kv_heads) without repeating k and v) for q [2, 32, 2048, 128]
and k, v [2, 8, 2048, 128] bf16. The batch is folded into the head axis (q [64, ...], k, v [16, ...]):
folded query head b * 32 + j then reads folded kv head b * 8 + j // 4, exactly GQA per batch element,
in one pallas_call (jax.vmap over the batch, as MaxText does, works on TPU but not in TPU interpret
mode). Splash does not scale the logits, so q is scaled by 1/sqrt(head_dim) first (in float32, rounded
once to bf16).
"""

import math

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import splash_attention as splash

BLOCK_Q = 512
BLOCK_KV = 1024  # kv rows fetched per grid step
BLOCK_KV_COMPUTE = 512  # kv rows per inner compute step (divides BLOCK_KV)


def computation(q, k, v):
  # q: [batch, q_heads, seq, head_dim], k, v: [batch, kv_heads, kv_seq, head_dim] bf16
  batch, q_heads, seq, head_dim = q.shape
  kv_heads, kv_seq = k.shape[1], k.shape[2]
  mask = splash.MultiHeadMask([splash.FullMask((seq, kv_seq)) for _ in range(batch * q_heads)])
  block_sizes = splash.BlockSizes(
      block_q=min(BLOCK_Q, seq),
      block_kv=min(BLOCK_KV, kv_seq),
      block_kv_compute=min(BLOCK_KV_COMPUTE, kv_seq),
  )
  kernel = splash.make_splash_mha_single_device(mask, block_sizes=block_sizes)
  q = (q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))).astype(q.dtype)
  out = kernel(
      q.reshape(batch * q_heads, seq, head_dim),
      k.reshape(batch * kv_heads, kv_seq, head_dim),
      v.reshape(batch * kv_heads, kv_seq, head_dim),
  )  # [batch * q_heads, seq, head_dim] bf16
  return out.reshape(batch, q_heads, seq, head_dim)
