"""The retention kernel's fixed helpers, as real functions: a written kernel is self-contained, so source.py pastes
their text into it (agents.offline.helper_text); here ruff reads them and the tests call them."""

import jax.numpy as jnp
from jax import lax


def _column_decay(rate, kv, block, last):
    """exp(rate (c - m)) for the keys m of block kv, c the query block's last position: at most 1 on and below
    the diagonal, so it cannot overflow; shape (1, block)."""
    keys = kv * block + lax.broadcasted_iota(jnp.int32, (1, block), 1)
    return jnp.exp(rate * (last - keys).astype(jnp.float32))


def _row_decay(rate, qi, block, last):
    """exp(rate (n - c)) for the queries n of block qi: the decay's other factor, the same for every key block of
    these rows, so it is applied once at the end; shape (block, 1)."""
    queries = qi * block + lax.broadcasted_iota(jnp.int32, (block, 1), 0)
    return jnp.exp(rate * (queries - last).astype(jnp.float32))


def _causal_zero(s):
    """A diagonal block's scores with the keys after each query set to zero (the decay is zero there)."""
    rows = lax.broadcasted_iota(jnp.int32, s.shape, 0)
    cols = lax.broadcasted_iota(jnp.int32, s.shape, 1)
    return jnp.where(rows >= cols, s, 0.0)


def _weighted_scores(q_ref, k_ref, rate, qi, kv, block, last):
    """The block's f32 scores q k^T times the decay's key factor, zero after each query on the diagonal block."""
    s = lax.dot_general(q_ref[...], k_ref[...], (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    s = s * _column_decay(rate, kv, block, last)
    return lax.cond(kv == qi, _causal_zero, lambda s: s, s)
