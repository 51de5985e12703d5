"""The flash-attention kernel's helpers, as real functions: a written kernel is self-contained, so source.py pastes
their text into it (agents.offline.helper_text); here ruff reads them and the tests call them.

The grid's walk comes in two variants that the kernel names alike (`_positions`, `_starts`, `_ends`): the square
causal grid's (`_paired_*`) and the full rectangle's (`_rectangle_*`).
"""

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def _paired_positions(i, j, n_q):
    """The square causal grid: its row i is query block i (steps j <= i), then query block n_q - 1 - i, each
    against the key blocks up to its diagonal: n_q + 1 steps of equal work (for odd n_q the middle block's row
    is computed twice)."""
    first = j <= i
    return jnp.where(first, i, n_q - 1 - i), jnp.where(first, j, j - i - 1)


def _paired_starts(i, j, qi, kv):
    return jnp.logical_or(j == 0, j == i + 1)


def _paired_ends(i, j, qi, kv):
    return kv == qi


def _rectangle_positions(i, j, n_q):
    return i, j


def _rectangle_starts(i, j, qi, kv):
    return j == 0


def _rectangle_ends(i, j, qi, kv):
    return j == pl.num_programs(3) - 1


def _rows_from_lanes(ref, hb, d):
    """A (block_q, hb x d) block read in place -> (hb x block_q, d): heads side by side on the lanes, as rows."""
    if hb == 1:
        return ref[...]
    return jnp.concatenate([ref[:, h * d:(h + 1) * d] for h in range(hb)], axis=0)


def _stacked_bias(ref, hb, block_q, block_kv):
    """The bias tile for hb heads stacked as rows, broadcast along its size-1 axes."""
    tile = jnp.broadcast_to(ref[...].astype(jnp.float32), (hb, block_q, block_kv))
    return tile.reshape(hb * block_q, block_kv)


def _causal_mask(s, *, block_q, offset):
    """Keys after the query masked; the rows are hb heads' block_q queries stacked, `offset` is the first query's
    position minus the first key's."""
    rows = lax.rem(lax.broadcasted_iota(jnp.int32, (s.shape[0], 1), 0), block_q) + offset
    cols = lax.broadcasted_iota(jnp.int32, (1, s.shape[1]), 1)
    return jnp.where(rows >= cols, s, MASK_VALUE)


def _block(dim, want):
    """All of the sequence when it fits, else the largest multiple of 128 up to `want` that divides it."""
    if dim <= want:
        return dim
    b = max(128, want - want % 128)
    while b > 128 and dim % b:
        b -= 128
    return b
