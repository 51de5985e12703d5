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


def _bias_tile(ref, h, r0, rows, keys):
    """The f32 bias for query rows r0 .. r0 + rows of stacked head h against the first `keys` keys, broadcast
    along the block's size-1 axes (a bias without heads, queries or keys)."""
    n_h, n_q, n_k = ref.shape
    tile = ref[h if n_h > 1 else 0, pl.ds(r0, rows) if n_q > 1 else pl.ds(0, 1), pl.ds(0, keys if n_k > 1 else 1)]
    return jnp.broadcast_to(tile.astype(jnp.float32), (rows, keys))


def _each_chunk(chunk, hb, n_chunks, rows, keys, masked):
    """chunk(h, r0, keys, masked) over the row chunks of every stacked head: a rolled loop over a head's chunks,
    so each chunk's scores are a tile the scheduler keeps close instead of the whole block's."""
    for h in range(hb):
        if n_chunks == 1:
            chunk(h, 0, keys, masked)
            continue

        def body(c, carry, h=h):
            chunk(h, pl.multiple_of(c * rows, rows), keys, masked)
            return carry

        lax.fori_loop(0, n_chunks, body, 0)


def _diagonal_chunks(chunk, hb, n_chunks, rows, keys):
    """The diagonal block of a square causal grid: chunk c of rows sees the keys up to its last row only (half
    the block's work); written out when there are few chunks, else the masked rolled loop over all keys."""
    if hb * n_chunks > 8:
        _each_chunk(chunk, hb, n_chunks, rows, keys, True)
        return
    for h in range(hb):
        for c in range(n_chunks):
            chunk(h, c * rows, min(keys, (c + 1) * rows), True)


def _diagonal_tiles(chunk, tiles, n_chunks, rows, keys):
    """The diagonal block of a square causal grid with several stacked tiles (batch elements x heads): a rolled
    loop over the tiles, each tile's chunks of rows written out against the keys up to their last row (half the
    block's work, in code the size of one tile's); the masked rolled loop over all keys when one tile alone has
    too many chunks to write out."""
    if n_chunks > 8:
        _each_chunk(chunk, tiles, n_chunks, rows, keys, True)
        return

    def body(g, carry):
        for c in range(n_chunks):
            chunk(g, c * rows, min(keys, (c + 1) * rows), True)
        return carry

    lax.fori_loop(0, tiles, body, 0)


def _causal_mask(s, offset):
    """Keys after the query masked; `offset` is the first row's query position minus the first key's."""
    rows = lax.broadcasted_iota(jnp.int32, (s.shape[0], 1), 0) + offset
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
