"""Helpers the row-wise, matmul and scan kernels the offline brain writes define, as real functions.

A written kernel is self-contained, so these are pasted into it as source (agents.offline.helper_text); here they
are code that ruff reads and the tests call. `_to` reads the kernel module's ELEMENTWISE_DTYPES, which the value
below stands in for.
"""

import jax.numpy as jnp
from jax import lax

ELEMENTWISE_DTYPES = "reference"  # the written kernel's TUNABLE value takes this one's place


def _block(dim, want, align):
    """All of a dimension when it fits in `want`, else the largest aligned divisor up to `want`, else `want`
    rounded to the alignment (the array is then padded to whole blocks)."""
    if dim <= want:
        return dim
    size = max(align, want - want % align)
    b = size
    while b >= align:
        if dim % b == 0:
            return b
        b -= align
    return size


def _padded(x, axis, size):
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _round_up(n, b):
    return -(-n // b) * b


def _to(x, dtype):
    """x in the reference's float dtype, or in f32 throughout (ELEMENTWISE_DTYPES)."""
    return jnp.asarray(x).astype(dtype if ELEMENTWISE_DTYPES == "reference" else jnp.float32)


# Sums over groups of consecutive columns and their broadcast back, as matmuls with a 0/1 matrix: exact (one bf16
# pass for bf16 values, three bf16 parts for f32 ones), with no reshape of the lanes. Written only where used.


def _seg_matrix(n, g, back=False):
    """(n, n // g) ones where column j gathers lanes j*g .. j*g + g - 1; `back`: its transpose."""
    shape = (n // g, n) if back else (n, n // g)
    lane = lax.broadcasted_iota(jnp.int32, shape, 1 if back else 0)
    group = lax.broadcasted_iota(jnp.int32, shape, 0 if back else 1)
    return (lax.div(lane, g) == group).astype(jnp.bfloat16)


def _exact_dot(x, m):
    """x @ m in f32 for a 0/1 matrix m: one bf16 pass for bf16 x, three bf16 parts of an f32 x."""
    dims = (((x.ndim - 1,), (0,)), ((), ()))
    if x.dtype == jnp.bfloat16:
        return lax.dot_general(x, m, dims, preferred_element_type=jnp.float32)
    x = x.astype(jnp.float32)
    hi = x.astype(jnp.bfloat16)
    rest = x - hi.astype(jnp.float32)
    mid = rest.astype(jnp.bfloat16)
    lo = (rest - mid.astype(jnp.float32)).astype(jnp.bfloat16)
    return sum(lax.dot_general(part, m, dims, preferred_element_type=jnp.float32) for part in (hi, mid, lo))


def _seg_sum(x, g):
    """The f32 sum of each group of g consecutive columns: (rows, cols) -> (rows, cols / g).

    The 0/1 matrix is block diagonal: each 128 groups (a lane tile of sums) read only their 128 * g columns, so
    beyond that the sums go a block at a time; one dense matrix would do cols / g / 128 times the MXU work (on
    40k's 8192 columns in groups of 16, 4x: ~300 GFLOP more than its 550 GFLOP GEMM)."""
    return _seg_dot(x, 128 * g, lambda n: _seg_matrix(n, g))


def _seg_expand(x, g):
    """Each group's value on its g columns: (rows, cols / g) -> (rows, cols); a lane tile of groups at a time,
    as _seg_sum."""
    return _seg_dot(x, 128, lambda n: _seg_matrix(n * g, g, back=True)).astype(x.dtype)


def _seg_dot(x, span, matrix):
    """x @ matrix(cols) for a block-diagonal 0/1 matrix whose blocks read `span` columns: one dense dot up to a
    block, else a dot per block with matrix(span), concatenated on lane-tile boundaries."""
    if x.shape[-1] <= span or x.shape[-1] % span:
        return _exact_dot(x, matrix(x.shape[-1]))
    block = matrix(span)
    return jnp.concatenate([_exact_dot(x[..., s:s + span], block) for s in range(0, x.shape[-1], span)], axis=-1)
