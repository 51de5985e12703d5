"""Ragged paged attention for a mixed prefill + decode batch, bfloat16 in/out, softmax in float32.

One serving step (as in vLLM on TPU): the new query tokens of all sequences are concatenated, sequence
i owning q rows [cu_q_lens[i], cu_q_lens[i+1]) (1 row for a decode, a chunk for a prefill). Its KV
cache of kv_lens[i] tokens (the new ones last, so kv_lens[i] >= q_len) lives in pages of a shared pool:
token t is row t % page_size of page page_indices[i, t // page_size]. k and v are interleaved on the
head axis of kv_pages (k of kv head h at 2h, v at 2h + 1). Query row j of sequence i (0-based) sits at
position kv_lens[i] - q_len + j and attends causally to cached tokens 0..that position. Only the first
num_seqs[0] sequences are used, and together they fill all q rows. Llama-3-8B-like heads: 32 query
heads share 8 kv heads (query head h uses kv head h // 4), head_dim 128, scale 1/sqrt(head_dim);
1024 q tokens, 16 sequences, pages of 128 tokens, up to 16 pages (2048 tokens) per sequence.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

Q_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
PAGE_SIZE, PAGES_PER_SEQ = 128, 16  # up to 2048 cached tokens per sequence
# 12 decodes and 4 prefill chunks (512 of them a fresh prompt), 1024 q tokens in all.
Q_LENS = (1, 1, 1, 512, 1, 1, 256, 1, 1, 1, 200, 1, 1, 44, 1, 1)
MAX_NUM_SEQS = len(Q_LENS)
TOTAL_PAGES = MAX_NUM_SEQS * PAGES_PER_SEQ  # the page pool, shared by all sequences


def computation(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
  # q: [num_tokens, q_heads, head_dim] bf16
  # kv_pages: [total_pages, page_size, 2 * kv_heads, head_dim] bf16, k and v interleaved on axis 2
  # kv_lens: [max_num_seqs] int32; page_indices: [max_num_seqs, pages_per_seq] int32 in [0, total_pages)
  # cu_q_lens: [max_num_seqs + 1] int32, cu_q_lens[0] = 0, nondecreasing; num_seqs: [1] int32
  num_tokens, q_heads, head_dim = q.shape
  _, page_size, combined_heads, _ = kv_pages.shape
  kv_heads = combined_heads // 2
  group = q_heads // kv_heads
  max_num_seqs, pages_per_seq = page_indices.shape
  max_len = pages_per_seq * page_size
  scale = 1.0 / math.sqrt(head_dim)
  # A window of num_tokens q rows starting at any sequence's first row always fits in q_pad.
  q_pad = jnp.concatenate([q, jnp.zeros_like(q)], axis=0)  # [2 * num_tokens, q_heads, head_dim]

  def one_sequence(i):
    start = cu_q_lens[i]
    q_len = cu_q_lens[i + 1] - start
    kv_len = kv_lens[i]
    qs = jax.lax.dynamic_slice_in_dim(q_pad, start, num_tokens, axis=0)  # [num_tokens, q_heads, d]
    kv = kv_pages[page_indices[i]].reshape(max_len, combined_heads, head_dim)
    k, v = kv[:, 0::2], kv[:, 1::2]  # [max_len, kv_heads, head_dim]
    qg = qs.reshape(num_tokens, kv_heads, group, head_dim)
    s = jnp.einsum("qhgd,khd->hgqk", qg, k, preferred_element_type=jnp.float32) * scale
    position = kv_len - q_len + jnp.arange(num_tokens)[:, None]  # [num_tokens, 1]
    key = jnp.arange(max_len)[None, :]  # [1, max_len]
    s = jnp.where((key <= position) & (key < kv_len), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)  # f32 [kv_heads, group, num_tokens, max_len]
    o = jnp.einsum("hgqk,khd->qhgd", p, v.astype(jnp.float32))
    return o.reshape(num_tokens, q_heads, head_dim)  # row j: the sequence's j-th query (if j < q_len)

  per_seq = jax.lax.map(one_sequence, jnp.arange(max_num_seqs))  # [max_num_seqs, num_tokens, ...]
  # Row t of the output belongs to sequence seq[t], as its query number t - cu_q_lens[seq[t]].
  t = jnp.arange(num_tokens)
  used = jnp.arange(max_num_seqs) < num_seqs[0]
  seq = jnp.sum((cu_q_lens[1:][None, :] <= t[:, None]) & used[None, :], axis=1)
  seq = jnp.minimum(seq, max_num_seqs - 1)
  out = per_seq[seq, t - cu_q_lens[seq]]  # [num_tokens, q_heads, head_dim]
  out = jnp.where((t < cu_q_lens[num_seqs[0]])[:, None, None], out, 0.0)
  return out.astype(q.dtype)


def _make_inputs(q_lens, q_heads, kv_heads, head_dim, page_size, pages_per_seq, total_pages, dtype,
                 seed):
  kq, kkv, kl, kp = jax.random.split(jax.random.PRNGKey(seed), 4)
  num_seqs = len(q_lens)
  num_tokens = sum(q_lens)
  max_len = pages_per_seq * page_size
  q_lens_arr = jnp.asarray(q_lens, dtype=jnp.int32)
  q = jax.random.normal(kq, (num_tokens, q_heads, head_dim), dtype=jnp.float32)
  kv_pages = jax.random.normal(kkv, (total_pages, page_size, 2 * kv_heads, head_dim), dtype=jnp.float32)
  # Cached context before the new tokens: anything that keeps kv_len in [q_len, max_len].
  context = jax.random.randint(kl, (num_seqs,), 0, max_len - q_lens_arr + 1, dtype=jnp.int32)
  kv_lens = q_lens_arr + context
  first_decode, first_prefill = q_lens.index(1), int(np.argmax(q_lens))
  kv_lens = kv_lens.at[first_decode].set(1)  # a sequence's first token
  kv_lens = kv_lens.at[first_decode + 1].set(max_len)  # a full cache
  kv_lens = kv_lens.at[first_prefill].set(q_lens[first_prefill])  # a fresh prompt
  pages = jax.random.permutation(kp, total_pages)[: num_seqs * pages_per_seq]
  page_indices = pages.reshape(num_seqs, pages_per_seq).astype(jnp.int32)
  cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]), dtype=jnp.int32)
  num_seqs_arr = jnp.asarray([num_seqs], dtype=jnp.int32)
  return [q.astype(dtype), kv_pages.astype(dtype), kv_lens, page_indices, cu_q_lens, num_seqs_arr], []


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(Q_LENS, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE, PAGES_PER_SEQ, TOTAL_PAGES, dtype,
                      seed=0)


def get_test_inputs(dtype=jnp.bfloat16):
  """Small enough for interpret mode; sequence lengths, offsets and the page table keep their meaning."""
  return _make_inputs((1, 1, 64, 1, 32, 1, 27, 1), 8, 2, HEAD_DIM, 16, 16, 128, dtype, seed=1)
