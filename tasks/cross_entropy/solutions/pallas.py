"""Pallas TPU kernel: per-row softmax cross-entropy with an online log-sum-exp over vocab blocks."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# The search and the autotuner vary these (agents.tunable); the values below are the defaults.
TUNABLE = {
    "DEFAULT_BLOCK_ROWS": (64, 128, 256, 512),
    "DEFAULT_BLOCK_VOCAB": (512, 1024, 2048, 4096, 8192),
    "VMEM_LIMIT_BYTES": (33554432, 50331648, 67108864, 104857600),
}
DEFAULT_BLOCK_ROWS = 256
DEFAULT_BLOCK_VOCAB = 2048
VMEM_LIMIT_BYTES = 48 * 1024 * 1024
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  block_rows: int
  block_vocab: int

  @classmethod
  def get_default(cls, rows: int, vocab: int) -> "BlockSizes":
    block_rows = min(DEFAULT_BLOCK_ROWS, rows)
    block_vocab = min(DEFAULT_BLOCK_VOCAB, vocab)
    if rows % block_rows or vocab % block_vocab:
      raise ValueError(
          f"shape {(rows, vocab)} not divisible by blocks {(block_rows, block_vocab)}")
    return cls(block_rows=block_rows, block_vocab=block_vocab)


def computation(logits, labels):
  rows, vocab = logits.shape
  block_sizes = BlockSizes.get_default(rows, vocab)
  loss = _cross_entropy(logits, labels.astype(jnp.int32).reshape(rows, 1), block_sizes=block_sizes)
  return loss.reshape(rows)


@functools.partial(jax.jit, static_argnames=["block_sizes"])
def _cross_entropy(logits, labels2d, *, block_sizes: BlockSizes):
  rows, vocab = logits.shape
  bm, bv = block_sizes.block_rows, block_sizes.block_vocab
  grid = (rows // bm, vocab // bv)
  kernel = functools.partial(_cross_entropy_kernel, block_vocab=bv)
  return pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((rows, 1), jnp.float32),
      grid=grid,
      in_specs=[
          pl.BlockSpec((bm, bv), lambda i, v: (i, v)),  # logits
          pl.BlockSpec((bm, 1), lambda i, v: (i, 0)),  # labels
      ],
      out_specs=pl.BlockSpec((bm, 1), lambda i, v: (i, 0)),
      scratch_shapes=[
          pltpu.VMEM((bm, 1), jnp.float32),  # running max
          pltpu.VMEM((bm, 1), jnp.float32),  # running sum of exp(x - max)
          pltpu.VMEM((bm, 1), jnp.float32),  # logit at the label
      ],
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "arbitrary"),
          vmem_limit_bytes=VMEM_LIMIT_BYTES,
      ),
      cost_estimate=pl.CostEstimate(
          flops=6 * rows * vocab,
          transcendentals=rows * vocab,
          bytes_accessed=logits.size * logits.dtype.itemsize + 8 * rows,
      ),
  )(logits, labels2d)


def _cross_entropy_kernel(logits_ref, labels_ref, loss_ref, m_ref, l_ref, picked_ref, *,
                          block_vocab: int):
  # logits_ref: [block_rows, block_vocab], labels_ref: [block_rows, 1] int32
  # loss_ref, m_ref, l_ref, picked_ref: [block_rows, 1] f32
  v_idx = pl.program_id(1)

  @pl.when(v_idx == 0)
  def _init():
    m_ref[...] = jnp.full_like(m_ref, MASK_VALUE)
    l_ref[...] = jnp.zeros_like(l_ref)
    picked_ref[...] = jnp.zeros_like(picked_ref)

  x = logits_ref[...].astype(jnp.float32)  # [block_rows, block_vocab]
  m_prev = m_ref[...]  # [block_rows, 1]
  m_next = jnp.maximum(m_prev, jnp.max(x, axis=-1, keepdims=True))  # [block_rows, 1]
  l_ref[...] = (l_ref[...] * jnp.exp(m_prev - m_next)
                + jnp.sum(jnp.exp(x - m_next), axis=-1, keepdims=True))
  m_ref[...] = m_next

  cols = v_idx * block_vocab + jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
  hit = cols == labels_ref[...]  # [block_rows, block_vocab]
  picked_ref[...] += jnp.sum(jnp.where(hit, x, 0.0), axis=-1, keepdims=True)

  @pl.when(v_idx == pl.num_programs(1) - 1)
  def _store():
    loss_ref[...] = (m_ref[...] + jnp.log(l_ref[...]) - picked_ref[...]).astype(loss_ref.dtype)
