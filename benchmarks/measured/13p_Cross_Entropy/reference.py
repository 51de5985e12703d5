"""Language-model head and loss: mean negative log-likelihood of int labels under log_softmax(hidden @ W).

hidden [8192, 4096] (tokens, model) and W [4096, 128256] (model, vocabulary) bfloat16, labels int32 [8192] in
[0, 128256). The logits [8192, 128256] come out of the matmul in bf16 and log_softmax over the vocabulary stays
in bf16; each token's log-likelihood is picked by multiplying with the f32 one-hot of its label and summing over
the vocabulary (as the measured program's FLOP count says it was done, rather than by a gather); the loss is the
mean over the tokens, an f32 scalar.
"""

import jax
import jax.numpy as jnp

TOKENS, D_MODEL, VOCAB = 8192, 4096, 128256


def computation(hidden, w, labels):
  vocab = w.shape[1]
  logp = jax.nn.log_softmax(hidden @ w, axis=-1)  # [tokens, vocab] bf16
  nll = -jnp.sum(jax.nn.one_hot(labels, vocab, dtype=jnp.float32) * logp, axis=-1)  # f32
  return jnp.mean(nll)


def get_inputs():
  kh, kw, kl = jax.random.split(jax.random.PRNGKey(0), 3)
  hidden = jax.random.normal(kh, (TOKENS, D_MODEL), dtype=jnp.bfloat16)
  w = (jax.random.normal(kw, (D_MODEL, VOCAB), dtype=jnp.float32)
       / jnp.sqrt(jnp.float32(D_MODEL))).astype(jnp.bfloat16)
  labels = jax.random.randint(kl, (TOKENS,), 0, VOCAB, dtype=jnp.int32)
  return [hidden, w, labels], []
