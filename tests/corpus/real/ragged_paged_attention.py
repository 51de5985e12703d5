"""Candidate for tasks/ragged_paged_attention: JAX's ragged paged attention TPU kernel.

Wraps jax.experimental.pallas.ops.tpu.ragged_paged_attention.ragged_paged_attention (mixed prefill and
decode, k and v interleaved in one paged cache) for q [1024, 32, 128] bf16 and kv_pages
[256, 128, 16, 128] bf16 with 16 pages per sequence. Block sizes are those the module's v6e table gives
for this configuration (no exact entry, so its v6e default (128 pages, 32 queries), capped at
pages_per_seq): 16 kv pages (2048 tokens) and 32 query tokens per block.
"""

import math

from jax.experimental.pallas.ops.tpu import ragged_paged_attention as rpa

NUM_KV_PAGES_PER_BLOCK = 16
NUM_QUERIES_PER_BLOCK = 32


def computation(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
  # q: [num_tokens, q_heads, head_dim] bf16; kv_pages: [total_pages, page_size, 2 * kv_heads, head_dim]
  # kv_lens: [max_num_seqs]; page_indices: [max_num_seqs, pages_per_seq]; cu_q_lens: [max_num_seqs + 1]
  # num_seqs: [1] (all int32) -> [num_tokens, q_heads, head_dim] bf16
  num_tokens, _, head_dim = q.shape
  pages_per_seq = page_indices.shape[1]
  return rpa.ragged_paged_attention(
      q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
      sm_scale=1.0 / math.sqrt(head_dim),
      num_kv_pages_per_block=min(NUM_KV_PAGES_PER_BLOCK, pages_per_seq),  # the kernel requires <=
      num_queries_per_block=min(NUM_QUERIES_PER_BLOCK, num_tokens),
  )
