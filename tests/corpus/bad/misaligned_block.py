"""Block rows of 7 break the (8, 128) tiling rule."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

BLOCK_ROWS = 64


def computation(x):
    rows, cols = x.shape
    bm = min(BLOCK_ROWS, rows)
    return pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        grid=(rows // bm,),
        in_specs=[pl.BlockSpec((7, cols), lambda i: (i, 0))],
        out_specs=pl.BlockSpec((7, cols), lambda i: (i, 0)),
    )(x)


def _kernel(x_ref, o_ref):
    x = x_ref[...]
    e = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    o_ref[...] = e / jnp.sum(e, axis=-1, keepdims=True)
