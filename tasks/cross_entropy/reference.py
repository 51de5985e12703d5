"""Per-row softmax cross-entropy loss from f32 logits and int32 class labels."""

import jax
import jax.numpy as jnp


def computation(logits, labels):
  # logits: [rows, vocab] f32, labels: [rows] int32 in [0, vocab) -> loss [rows] f32
  logits = logits.astype(jnp.float32)
  m = jnp.max(logits, axis=-1, keepdims=True)
  lse = jnp.log(jnp.sum(jnp.exp(logits - m), axis=-1)) + m[:, 0]
  picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
  return lse - picked


def _make_inputs(rows, vocab, dtype, seed):
  kl, ky = jax.random.split(jax.random.PRNGKey(seed))
  logits = (2.0 * jax.random.normal(kl, (rows, vocab), dtype=jnp.float32)).astype(dtype)
  labels = jax.random.randint(ky, (rows,), 0, vocab, dtype=jnp.int32)
  return [logits, labels], []


def get_inputs(dtype=jnp.float32):
  return _make_inputs(8192, 32768, dtype, seed=0)


def get_test_inputs(dtype=jnp.float32):
  return _make_inputs(64, 4096, dtype, seed=1)
