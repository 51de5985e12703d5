"""The prefix-sum kernel's helpers, as real functions: a written kernel is self-contained, so source.py pastes their
text into it (agents.offline.helper_text); here ruff reads them and the tests call them. (`_block`, `_padded` and
`_round_up` are the shared ones of agents.offline.kernel_helpers.)

Within a chunk of c elements the prefix sums are one matmul with a c x c triangle of ones. The kernel names its
triangle `_triangle` and its product `_prefix`; which variant it gets depends on the scan's axis and direction:
- along the lanes (a block is (rows, c)), y = s @ t: t[i, j] = 1 where element i counts towards position j
  (`_triangle_lanes`, or `_triangle_lanes_reverse`), and `_prefix_lanes`;
- across them (a block is (c, lanes)), y = t @ s: t[i, j] = 1 where element j counts towards position i
  (`_triangle_sublanes`, or `_triangle_sublanes_reverse`), and `_prefix_sublanes`.
"""

import jax.numpy as jnp
from jax import lax

SPLITS = 2  # the written kernel's TUNABLE value takes this one's place


def _triangle_lanes(c):
    """The 0/1 matrix whose product with a chunk is the chunk's prefix sums (exact in bf16)."""
    i = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    j = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    return jnp.where(i <= j, 1.0, 0.0).astype(jnp.bfloat16)


def _triangle_lanes_reverse(c):
    """The 0/1 matrix whose product with a chunk is the chunk's prefix sums (exact in bf16)."""
    i = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    j = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    return jnp.where(i >= j, 1.0, 0.0).astype(jnp.bfloat16)


def _triangle_sublanes(c):
    """The 0/1 matrix whose product with a chunk is the chunk's prefix sums (exact in bf16)."""
    i = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    j = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    return jnp.where(j <= i, 1.0, 0.0).astype(jnp.bfloat16)


def _triangle_sublanes_reverse(c):
    """The 0/1 matrix whose product with a chunk is the chunk's prefix sums (exact in bf16)."""
    i = lax.broadcasted_iota(jnp.int32, (c, c), 0)
    j = lax.broadcasted_iota(jnp.int32, (c, c), 1)
    return jnp.where(j >= i, 1.0, 0.0).astype(jnp.bfloat16)


def _prefix_lanes(s, t):
    """The chunk's prefix sums on the MXU, f32-accurate: s is split into SPLITS bf16 parts (each the rounding
    rest of the ones before it, exact in f32), and each part times the 0/1 triangle accumulates in f32."""
    y = None
    rest = s
    for _ in range(SPLITS):
        part = rest.astype(jnp.bfloat16)
        rest = rest - part.astype(jnp.float32)
        d = jnp.dot(part, t, preferred_element_type=jnp.float32)
        y = d if y is None else y + d
    return y


def _prefix_sublanes(s, t):
    """The chunk's prefix sums on the MXU, f32-accurate: s is split into SPLITS bf16 parts (each the rounding
    rest of the ones before it, exact in f32), and each part times the 0/1 triangle accumulates in f32."""
    y = None
    rest = s
    for _ in range(SPLITS):
        part = rest.astype(jnp.bfloat16)
        rest = rest - part.astype(jnp.float32)
        d = jnp.dot(t, part, preferred_element_type=jnp.float32)
        y = d if y is None else y + d
    return y
