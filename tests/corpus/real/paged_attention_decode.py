"""Candidate for tasks/paged_attention_decode: JAX's paged attention TPU kernel (one decode step).

Wraps jax.experimental.pallas.ops.tpu.paged_attention.paged_attention for q [32, 32, 128] bf16 against
k_pages, v_pages [8, 2048, 64, 128] bf16 with 64 pages per sequence: 8 pages (512 tokens) per compute
block, the sequence loop inlined into each (batch, kv head) grid step. The kernel does not scale the
logits, so q is scaled by 1/sqrt(head_dim) first (in float32, which the kernel uses for q anyway when
q_heads / kv_heads is not a multiple of 8).
"""

import math

import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu import paged_attention as pa

PAGES_PER_COMPUTE_BLOCK = 8  # 8 pages of 64 tokens: 512 kv tokens per compute block


def computation(q, k_pages, v_pages, lengths, page_indices):
  # q: [batch, q_heads, head_dim] bf16; k_pages, v_pages: [kv_heads, total_pages, page_size, head_dim]
  # lengths: [batch] int32; page_indices: [batch, pages_per_seq] int32 -> [batch, q_heads, head_dim] bf16
  head_dim = q.shape[-1]
  pages_per_seq = page_indices.shape[1]
  q_scaled = q.astype(jnp.float32) * (1.0 / math.sqrt(head_dim))
  out = pa.paged_attention(
      q_scaled, k_pages, v_pages, lengths, page_indices,
      pages_per_compute_block=min(PAGES_PER_COMPUTE_BLOCK, pages_per_seq),
      megacore_mode=None,  # v6e has one TensorCore per chip
      inline_seq_dim=True,
  )
  return out.astype(q.dtype)
