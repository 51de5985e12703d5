"""Pallas TPU kernel: grouped-query flash attention (non-causal, online softmax).

Grid (batch, q_heads, q_blocks, kv_blocks) with the kv axis last and "arbitrary". The k / v
index maps send query head h to kv head h // group, so kv heads are shared without being
repeated in HBM.
"""

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "DEFAULT_BLOCK_Q": (128, 256, 512, 1024),
    "DEFAULT_BLOCK_KV": (128, 256, 512, 1024),
}
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_KV = 512


def _pick_block(dim, preferred, align):
  """Largest multiple of `align` that divides `dim` and is <= `preferred` (else `dim`)."""
  if dim <= preferred:
    return dim
  block = preferred - preferred % align
  while block >= align:
    if dim % block == 0:
      return block
    block -= align
  return dim


def _gqa_flash_kernel(q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, acc_ref, *,
                      sm_scale, num_kv_blocks):
  # q_ref: [block_q, head_dim], k_ref / v_ref: [block_kv, head_dim] (batch, head squeezed)
  # o_ref: [block_q, head_dim]
  # m_ref, l_ref: [block_q, 1] f32 scratch, acc_ref: [block_q, head_dim] f32 scratch
  kv_idx = pl.program_id(3)

  @pl.when(kv_idx == 0)
  def _init():
    m_ref[...] = jnp.full_like(m_ref, -jnp.inf)
    l_ref[...] = jnp.zeros_like(l_ref)
    acc_ref[...] = jnp.zeros_like(acc_ref)

  q = q_ref[...]  # [block_q, head_dim]
  k = k_ref[...]  # [block_kv, head_dim]
  s = jax.lax.dot_general(
      q, k, (((1,), (1,)), ((), ())),
      preferred_element_type=jnp.float32) * sm_scale  # [block_q, block_kv]

  m_prev = m_ref[...]  # [block_q, 1]
  m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))  # [block_q, 1]
  alpha = jnp.exp(m_prev - m_new)  # [block_q, 1]
  p = jnp.exp(s - m_new)  # [block_q, block_kv]
  l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=-1, keepdims=True)
  pv = jnp.dot(p.astype(v_ref.dtype), v_ref[...],
               preferred_element_type=jnp.float32)  # [block_q, head_dim]
  acc_ref[...] = alpha * acc_ref[...] + pv
  m_ref[...] = m_new

  @pl.when(kv_idx == num_kv_blocks - 1)
  def _store():
    o_ref[...] = (acc_ref[...] / l_ref[...]).astype(o_ref.dtype)


def computation(q, k, v):
  batch, q_heads, seq, head_dim = q.shape
  _, kv_heads, kv_seq, _ = k.shape
  assert v.shape == k.shape and q_heads % kv_heads == 0, (q.shape, k.shape, v.shape)
  group = q_heads // kv_heads
  sm_scale = 1.0 / math.sqrt(head_dim)
  block_q = _pick_block(seq, DEFAULT_BLOCK_Q, 16)
  block_kv = _pick_block(kv_seq, DEFAULT_BLOCK_KV, 128)
  num_q_blocks = seq // block_q
  num_kv_blocks = kv_seq // block_kv
  grid = (batch, q_heads, num_q_blocks, num_kv_blocks)

  def q_index_map(b, h, i, j):
    return (b, h, i, 0)

  def kv_index_map(b, h, i, j):
    return (b, jax.lax.div(h, group), j, 0)

  kernel = functools.partial(
      _gqa_flash_kernel, sm_scale=sm_scale, num_kv_blocks=num_kv_blocks)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      grid=grid,
      in_specs=[
          pl.BlockSpec((None, None, block_q, head_dim), q_index_map),
          pl.BlockSpec((None, None, block_kv, head_dim), kv_index_map),
          pl.BlockSpec((None, None, block_kv, head_dim), kv_index_map),
      ],
      out_specs=pl.BlockSpec((None, None, block_q, head_dim), q_index_map),
      scratch_shapes=[
          pltpu.VMEM((block_q, 1), jnp.float32),
          pltpu.VMEM((block_q, 1), jnp.float32),
          pltpu.VMEM((block_q, head_dim), jnp.float32),
      ],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      cost_estimate=pl.CostEstimate(
          flops=2 * 2 * batch * q_heads * seq * kv_seq * head_dim,
          transcendentals=batch * q_heads * seq * kv_seq,
          bytes_accessed=q.dtype.itemsize * batch * head_dim * (
              2 * q_heads * seq + 2 * q_heads * num_q_blocks * kv_seq)),
  )(q, k, v)
