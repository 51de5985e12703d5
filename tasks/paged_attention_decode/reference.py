"""Paged grouped-query attention for one decode step, bfloat16 in/out, softmax in float32.

Each of `batch` sequences has one new query token and a KV cache of `lengths[b]` tokens stored in
fixed-size pages of a shared pool: token t of sequence b is row t % page_size of page
page_indices[b, t // page_size]. Llama-3-8B-like heads: 32 query heads share 8 kv heads (query head h
uses kv head h // 4), head_dim 128, scale 1/sqrt(head_dim); pages of 64 tokens, up to 64 pages (4096
tokens) per sequence.
"""

import math

import jax
import jax.numpy as jnp

BATCH, Q_HEADS, KV_HEADS, HEAD_DIM = 32, 32, 8, 128
PAGE_SIZE, PAGES_PER_SEQ = 64, 64  # up to 4096 cached tokens per sequence
TOTAL_PAGES = BATCH * PAGES_PER_SEQ  # the page pool, shared by all sequences


def computation(q, k_pages, v_pages, lengths, page_indices):
  # q: [batch, q_heads, head_dim] bf16
  # k_pages, v_pages: [kv_heads, total_pages, page_size, head_dim] bf16
  # lengths: [batch] int32 in [1, pages_per_seq * page_size]
  # page_indices: [batch, pages_per_seq] int32 in [0, total_pages)
  batch, q_heads, head_dim = q.shape
  kv_heads, _, page_size, _ = k_pages.shape
  pages_per_seq = page_indices.shape[1]
  group = q_heads // kv_heads
  max_len = pages_per_seq * page_size
  scale = 1.0 / math.sqrt(head_dim)
  # Gather each sequence's pages: [kv_heads, batch, max_len, head_dim].
  k = k_pages[:, page_indices].reshape(kv_heads, batch, max_len, head_dim)
  v = v_pages[:, page_indices].reshape(kv_heads, batch, max_len, head_dim)
  qg = q.reshape(batch, kv_heads, group, head_dim)
  s = jnp.einsum("bhgd,hbtd->bhgt", qg, k, preferred_element_type=jnp.float32) * scale
  valid = jnp.arange(max_len)[None, :] < lengths[:, None]  # [batch, max_len]
  s = jnp.where(valid[:, None, None, :], s, -jnp.inf)
  p = jax.nn.softmax(s, axis=-1)  # f32 [batch, kv_heads, group, max_len]
  out = jnp.einsum("bhgt,hbtd->bhgd", p, v.astype(jnp.float32))
  return out.reshape(batch, q_heads, head_dim).astype(q.dtype)


def _make_inputs(batch, q_heads, kv_heads, head_dim, page_size, pages_per_seq, total_pages, dtype,
                 seed):
  kq, kk, kv, kl, kp = jax.random.split(jax.random.PRNGKey(seed), 5)
  max_len = pages_per_seq * page_size
  q = jax.random.normal(kq, (batch, q_heads, head_dim), dtype=jnp.float32)
  k_pages = jax.random.normal(kk, (kv_heads, total_pages, page_size, head_dim), dtype=jnp.float32)
  v_pages = jax.random.normal(kv, (kv_heads, total_pages, page_size, head_dim), dtype=jnp.float32)
  # Context lengths anywhere in [1, max_len], with both ends present.
  lengths = jax.random.randint(kl, (batch,), 1, max_len + 1, dtype=jnp.int32)
  lengths = lengths.at[0].set(max_len).at[1].set(1)
  # Every sequence owns distinct pages, scattered over the pool.
  pages = jax.random.permutation(kp, total_pages)[: batch * pages_per_seq]
  page_indices = pages.reshape(batch, pages_per_seq).astype(jnp.int32)
  return [q.astype(dtype), k_pages.astype(dtype), v_pages.astype(dtype), lengths, page_indices], []


def get_inputs(dtype=jnp.bfloat16):
  return _make_inputs(BATCH, Q_HEADS, KV_HEADS, HEAD_DIM, PAGE_SIZE, PAGES_PER_SEQ, TOTAL_PAGES, dtype,
                      seed=0)


def get_test_inputs(dtype=jnp.bfloat16):
  """Small enough for interpret mode; the page table and lengths keep their meaning at this size."""
  return _make_inputs(4, 8, 2, HEAD_DIM, PAGE_SIZE, 16, 64, dtype, seed=1)
